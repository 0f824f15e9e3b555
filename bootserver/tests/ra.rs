#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! IPv6 router advertisements on the provisioning link, seen by tcpdump in the client's
//! namespace.

mod common;

use common::*;
use unbounded_testbed::netns::Link;

/// The first router advertisement tcpdump sees on the client's side within `seconds`, in
/// tcpdump's verbose words, or `None`. Fails the test when tcpdump did not start listening
/// (silence from a capture that never ran proves nothing).
fn first_advertisement(link: &Link, seconds: u32) -> Option<String> {
    let out = link
        .client
        .command("timeout")
        .arg(seconds.to_string())
        .args(["tcpdump", "-i", "eth0", "-n", "-v", "-c", "1"])
        .arg("icmp6 and ip6[40] == 134")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("listening on eth0"),
        "tcpdump did not capture: {stderr}"
    );
    // `timeout` ends an idle capture with 124; anything else is tcpdump failing.
    assert!(
        out.status.success() || out.status.code() == Some(124),
        "tcpdump: {:?} {stderr}",
        out.status
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.contains("router advertisement").then_some(text)
}

#[test]
fn the_link_hears_that_there_is_no_ipv6_router() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    let images = fake_images();
    let server = Bootserver::start(&link.server, &full_config(images.path(), ""));

    let advert = first_advertisement(&link, 15)
        .unwrap_or_else(|| panic!("no router advertisement within 15 s\n{}", server.log()));
    assert!(advert.contains("router lifetime 0s"), "{advert}");
    assert!(advert.contains("Flags [none]"), "no DHCPv6 flags: {advert}");
    assert!(!advert.contains("prefix info"), "no prefix: {advert}");
}

#[test]
fn with_dhcp6_full_the_link_hears_managed_and_other_and_its_prefix_on_link() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    // DHCPv6 binds the server address: it must be there before the bootserver starts.
    link.server
        .ip(&["-6", "addr", "add", "fd00:99::1/64", "dev", "pxe0", "nodad"])
        .unwrap();
    let images = fake_images();
    let config = full_config(images.path(), "").replace(
        "tftp: ",
        "dhcp6:\n  mode: full\n  serverAddress: fd00:99::1\n  subnets:\n    - prefix: fd00:99::/64\n      pool: [fd00:99::100, fd00:99::1ff]\ntftp: ",
    );
    let server = Bootserver::start(&link.server, &config);

    let advert = first_advertisement(&link, 15)
        .unwrap_or_else(|| panic!("no router advertisement within 15 s\n{}", server.log()));
    assert!(advert.contains("router lifetime 0s"), "{advert}");
    assert!(
        advert.contains("Flags [managed, other stateful]"),
        "M and O: {advert}"
    );
    // L=1 and A=0 read "Flags [onlink]"; with A it would be "[onlink, auto]".
    assert!(
        advert.contains("fd00:99::/64, Flags [onlink], valid time 7200s, pref. time 3600s"),
        "the prefix, on-link, no SLAAC: {advert}"
    );
}

#[test]
fn advertisements_can_be_turned_off() {
    let link = Link::new("10.99.0.1/24", "52:54:00:00:00:01").unwrap();
    let images = fake_images();
    let config = format!(
        "routerAdvertisements: false\n{}",
        full_config(images.path(), "")
    );
    let server = Bootserver::start(&link.server, &config);
    // Advertisements go out every 3 s: 8 s of silence means none are sent.
    assert_eq!(first_advertisement(&link, 8), None, "{}", server.log());
}
