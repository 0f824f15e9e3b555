use super::*;

fn key(n: u8) -> ClientKey {
    ClientKey::Hardware(mac(n))
}
fn mac(n: u8) -> MacAddr {
    MacAddr([2, 0, 0, 0, 0, n])
}
fn ip(n: u8) -> IpAddr {
    IpAddr::from([10, 0, 0, n])
}
fn lease(n: u8, at: u8, expires: u64) -> Lease {
    Lease {
        key: key(n),
        mac: mac(n),
        ip: ip(at),
        expires_unix: expires,
    }
}

/// Runs a transition and checks the invariants after it.
fn checked<T>(book: &mut AddressBook, f: impl FnOnce(&mut AddressBook) -> T) -> T {
    let out = f(book);
    if let Err(broken) = book.check() {
        panic!("{broken}: {book:#?}");
    }
    out
}

#[test]
fn an_offer_holds_the_address_until_it_lapses() {
    let mut book = AddressBook::default();
    checked(&mut book, |b| b.offer(&key(1), mac(1), ip(5), 100, 130)).unwrap();
    assert!(book.taken_from(ip(5), &key(2), 129));
    assert!(!book.taken_from(ip(5), &key(1), 129));
    assert_eq!(
        checked(&mut book, |b| b.offer(&key(2), mac(2), ip(5), 110, 140)),
        Err(Refused::Taken)
    );
    assert_eq!(book.claim_of(&key(1), 129), Some(ip(5)));
    // Lapsed: another client may have it, and the first one's view goes with it.
    checked(&mut book, |b| b.offer(&key(2), mac(2), ip(5), 130, 160)).unwrap();
    assert_eq!(book.claim_of(&key(1), 131), None);
    assert_eq!(book.claim_of(&key(2), 131), Some(ip(5)));
}

/// The defect of the old maps: a client whose offer lapsed and who was offered another
/// address erased the hold of the client now offered its old one.
#[test]
fn a_lapsed_client_moving_on_does_not_erase_the_new_holder() {
    let mut book = AddressBook::default();
    checked(&mut book, |b| b.offer(&key(1), mac(1), ip(5), 0, 30)).unwrap();
    checked(&mut book, |b| b.offer(&key(2), mac(2), ip(5), 31, 61)).unwrap();
    // Client 1 comes back and is offered another address.
    checked(&mut book, |b| b.offer(&key(1), mac(1), ip(6), 32, 62)).unwrap();
    assert!(book.taken_from(ip(5), &key(3), 33), "2's offer still holds");
    assert_eq!(
        checked(&mut book, |b| b.begin_commit(&key(3), mac(3), ip(5), 33)),
        Err(Refused::Taken)
    );
}

#[test]
fn a_commit_holds_the_address_however_long_it_takes() {
    let mut book = AddressBook::default();
    checked(&mut book, |b| b.offer(&key(1), mac(1), ip(5), 0, 30)).unwrap();
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 1)).unwrap();
    assert!(book.taken_from(ip(5), &key(2), 1_000_000));
    assert_eq!(book.lease_of(&key(1)), None, "not durable yet");
    assert!(checked(&mut book, |b| b.committed(&lease(1, 5, 3600), t)));
    assert_eq!(book.lease_of(&key(1)), Some(lease(1, 5, 3600)));
    assert!(book.taken_from(ip(5), &key(2), 3599));
    assert!(!book.taken_from(ip(5), &key(2), 3600), "expired");
    assert_eq!(book.active_leases(10), 1);
}

#[test]
fn a_failed_commit_gives_the_address_back() {
    let mut book = AddressBook::default();
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 1)).unwrap();
    checked(&mut book, |b| b.commit_failed(&lease(1, 5, 3600), t));
    assert!(book.is_empty());
    // With a durable lease already there, a failed renewal keeps the lease.
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 1)).unwrap();
    checked(&mut book, |b| b.committed(&lease(1, 5, 3600), t));
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 2)).unwrap();
    checked(&mut book, |b| b.commit_failed(&lease(1, 5, 7200), t));
    assert_eq!(book.lease_of(&key(1)), Some(lease(1, 5, 3600)));
}

#[test]
fn a_new_lease_ends_the_old_one_only_once_durable() {
    let mut book = AddressBook::default();
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    checked(&mut book, |b| b.committed(&lease(1, 5, 100), t));
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(6), 10)).unwrap();
    assert_eq!(book.lease_of(&key(1)).map(|l| l.ip), Some(ip(5)));
    assert!(book.taken_from(ip(5), &key(2), 10));
    checked(&mut book, |b| b.committed(&lease(1, 6, 200), t));
    assert_eq!(book.lease_of(&key(1)).map(|l| l.ip), Some(ip(6)));
    assert_eq!(book.slot(ip(5)), None);
}

#[test]
fn one_request_at_a_time_per_client() {
    let mut book = AddressBook::default();
    let _ = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    assert_eq!(
        checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(6), 0)),
        Err(Refused::CommitInFlight)
    );
    assert_eq!(
        checked(&mut book, |b| b.offer(&key(1), mac(1), ip(6), 0, 30)),
        Err(Refused::CommitInFlight)
    );
    // The same address again (a retransmitted REQUEST) is fine: two answers pending.
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    checked(&mut book, |b| b.committed(&lease(1, 5, 100), t));
    assert!(
        book.taken_from(ip(5), &key(2), 1_000),
        "one still in flight"
    );
    checked(&mut book, |b| b.committed(&lease(1, 5, 100), t));
    assert!(!book.taken_from(ip(5), &key(2), 1_000));
}

#[test]
fn release_and_decline() {
    let mut book = AddressBook::default();
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    checked(&mut book, |b| b.committed(&lease(1, 5, 100), t));
    assert!(
        !checked(&mut book, |b| b.release(&key(2), ip(5))),
        "not 2's"
    );
    assert!(
        !checked(&mut book, |b| b.release(&key(1), ip(6))),
        "not there"
    );
    assert!(checked(&mut book, |b| b.release(&key(1), ip(5))));
    assert!(book.is_empty());
    // A REQUEST in flight when the client released: its lease is refused.
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    checked(&mut book, |b| b.committed(&lease(1, 5, 100), t));
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    assert!(checked(&mut book, |b| b.release(&key(1), ip(5))));
    assert!(!checked(&mut book, |b| b.committed(&lease(1, 5, 200), t)));
    assert!(book.is_empty());
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    checked(&mut book, |b| b.committed(&lease(1, 5, 100), t));
    checked(&mut book, |b| b.decline(ip(5), 50));
    assert_eq!(book.lease_of(&key(1)), None);
    assert!(book.taken_from(ip(5), &key(1), 49));
    checked(&mut book, |b| b.offer(&key(2), mac(2), ip(5), 50, 80)).unwrap();
}

#[test]
fn a_decline_during_a_commit_wins() {
    let mut book = AddressBook::default();
    let t = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    checked(&mut book, |b| b.decline(ip(5), 50));
    assert!(!checked(&mut book, |b| b.committed(&lease(1, 5, 100), t)));
    assert_eq!(book.lease_of(&key(1)), None);
    checked(&mut book, |b| b.commit_failed(&lease(1, 5, 100), t));
    assert!(book.taken_from(ip(5), &key(1), 49));
}

/// A REQUEST accepted before a decline is not taken for one accepted after it.
#[test]
fn a_request_from_before_a_decline_is_not_the_new_holdings() {
    let mut book = AddressBook::default();
    let before = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 0)).unwrap();
    checked(&mut book, |b| b.decline(ip(5), 50));
    let after = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 60)).unwrap();
    assert_ne!(before, after);
    assert!(!checked(&mut book, |b| b.committed(&lease(1, 5, 100), before)));
    assert_eq!(book.lease_of(&key(1)), None);
    assert!(checked(&mut book, |b| b.committed(&lease(1, 5, 100), after)));
    assert_eq!(book.lease_of(&key(1)), Some(lease(1, 5, 100)));
}

#[test]
fn the_oldest_unrequested_offer_in_range_is_reclaimed() {
    let mut book = AddressBook::default();
    checked(&mut book, |b| b.offer(&key(1), mac(1), ip(5), 0, 30)).unwrap();
    checked(&mut book, |b| b.offer(&key(2), mac(2), ip(6), 1, 31)).unwrap();
    checked(&mut book, |b| b.offer(&key(3), mac(3), ip(7), 2, 32)).unwrap();
    let _ = checked(&mut book, |b| b.begin_commit(&key(1), mac(1), ip(5), 3)).unwrap();
    // 1 requested its offer: 2's is the oldest unrequested one.
    assert_eq!(
        checked(&mut book, |b| b
            .reclaim_oldest_offer(ip(5), ip(9), |_| true)),
        Some(ip(6))
    );
    assert_eq!(book.claim_of(&key(2), 4), None);
    assert_eq!(
        checked(&mut book, |b| b
            .reclaim_oldest_offer(ip(8), ip(9), |_| true)),
        None,
        "nothing offered in that range"
    );
    assert_eq!(
        checked(&mut book, |b| b
            .reclaim_oldest_offer(ip(5), ip(9), |_| true)),
        Some(ip(7))
    );
    assert_eq!(
        checked(&mut book, |b| b
            .reclaim_oldest_offer(ip(5), ip(9), |_| true)),
        None
    );
}

#[test]
fn sweeping_drops_lapsed_offers_only() {
    let mut book = AddressBook::default();
    checked(&mut book, |b| b.offer(&key(1), mac(1), ip(5), 0, 30)).unwrap();
    checked(&mut book, |b| b.offer(&key(2), mac(2), ip(6), 10, 40)).unwrap();
    let t = checked(&mut book, |b| b.begin_commit(&key(3), mac(3), ip(7), 0)).unwrap();
    checked(&mut book, |b| b.committed(&lease(3, 7, 20), t));
    checked(&mut book, |b| b.offer(&key(3), mac(3), ip(7), 25, 35)).unwrap();
    checked(&mut book, |b| b.sweep(36));
    assert_eq!(book.slot(ip(5)), None);
    assert_eq!(book.claim_of(&key(2), 36), Some(ip(6)));
    // 3's expired lease is remembered (it gets its address back), its offer swept.
    assert_eq!(book.lease_of(&key(3)).map(|l| l.ip), Some(ip(7)));
    assert_eq!(book.claim_of(&key(3), 36), None);
}

#[test]
fn a_restart_keeps_leases_and_declines() {
    let mut index = Index::default();
    index.apply(&Record::Commit(lease(1, 5, 100)));
    index.apply(&Record::Decline {
        ip: ip(6),
        until_unix: 50,
    });
    let book = AddressBook::from_durable(&index);
    book.check().unwrap();
    assert_eq!(book.lease_of(&key(1)), Some(lease(1, 5, 100)));
    assert!(book.taken_from(ip(6), &key(1), 49));
}
