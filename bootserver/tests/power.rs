#![allow(clippy::unwrap_used, clippy::expect_used)] // a panic is the test failure report
//! The Redfish and IPMI drivers against real BMC emulators (sushy-tools and OpenIPMI's ipmi_sim)
//! that drive real QEMU VMs through libvirt. A one-time PXE boot plus power on makes the VM
//! network-boot from our bootserver to the marker; cycle and off follow. Error paths: a
//! wrong password, an unreachable BMC, a BMC that answers 500 or never answers.
//!
//! libvirtd is one per machine, so every VM case runs in one test, in turn.

mod common;

use std::time::Duration;

use common::*;
use unbounded_pxe::power::{
    Backoff, Bmc, BmcAddress, Credentials, Power, PowerDriver, PowerError, Tls, with_retries,
};
use unbounded_testbed::bmc::{Domain, IpmiSim, Libvirtd, SushyEmulator, free_port};
use unbounded_testbed::netns::Netns;
use unbounded_testbed::qemu::marker_image;

const PASSWORD: &str = "s3cret-bmc-pa55";
const REDFISH_MAC: &str = "52:54:00:00:02:01";
const IPMI_MAC: &str = "52:54:00:00:02:02";
const BOOT_TIMEOUT: Duration = Duration::from_secs(240);

/// Everything the VM tests share; fields drop in declaration order (VMs before libvirtd).
struct Lab {
    redfish_vm: Domain,
    ipmi_vm: Domain,
    sushy: SushyEmulator,
    ipmi_sim: IpmiSim,
    _libvirtd: Libvirtd,
    bootserver: Bootserver,
    _ns: Netns,
}

fn config(images: &std::path::Path) -> String {
    let machines = format!(
        r#"machines:
  - name: redfish-node
    macs: ["{REDFISH_MAC}"]
    firmware: bios
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0, unbounded.marker=hold]}}
  - name: ipmi-node
    macs: ["{IPMI_MAC}"]
    firmware: bios
    boot: {{kernel: vmlinuz, initrd: initrd.img, args: [console=ttyS0, unbounded.marker=hold]}}
"#
    );
    bridge_config(images, &machines)
}

impl Lab {
    fn start() -> Self {
        let images = marker_image().unwrap();
        let ns = bridge_namespace("ubw");
        let bootserver = Bootserver::start(&ns, &config(&images));
        let libvirtd = Libvirtd::start(&ns).unwrap();
        let pid = std::process::id();
        let redfish_vm =
            Domain::define(&format!("ub-rf-{pid}"), REDFISH_MAC, "br0", false).unwrap();
        let ipmi_vm = Domain::define(&format!("ub-ipmi-{pid}"), IPMI_MAC, "br0", false).unwrap();
        let sushy = SushyEmulator::start("admin", PASSWORD).unwrap();
        let ipmi_sim = IpmiSim::start(&ipmi_vm.name, "admin", PASSWORD).unwrap();
        Self {
            redfish_vm,
            ipmi_vm,
            sushy,
            ipmi_sim,
            _libvirtd: libvirtd,
            bootserver,
            _ns: ns,
        }
    }

    fn redfish_address(&self) -> String {
        format!(
            "redfish+http://127.0.0.1:{}/redfish/v1/Systems/{}",
            self.sushy.port, self.redfish_vm.uuid
        )
    }

    fn ipmi_address(&self) -> String {
        format!("ipmi://127.0.0.1:{}", self.ipmi_sim.port)
    }
}

fn bmc(address: &str, password: &str) -> Bmc {
    Bmc::new(
        &BmcAddress::parse(address).unwrap(),
        Credentials::new("admin", password),
        &Tls::default(),
        Duration::from_secs(5),
    )
    .unwrap()
}

/// Waits (polling the BMC) until it reports `want`.
async fn wait_for_power(driver: &Bmc, want: Power, log: &impl Fn() -> String) {
    for _ in 0..60 {
        match driver.power_state().await {
            Ok(state) if state == want => return,
            Ok(_) => {}
            Err(error) => panic!("{error}\n{}", log()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("the BMC never reported {want:?}\n{}", log());
}

/// One-time PXE + on → marker; state on; cycle → marker again; off → state off.
async fn power_sequence(driver: &Bmc, vm: &Domain, machine: &str, lab_log: impl Fn() -> String) {
    let _ = driver.power_off(Duration::ZERO).await;
    wait_for_power(driver, Power::Off, &lab_log).await;
    let before = vm.console().matches("UNBOUNDED-MARKER").count();

    driver.set_one_time_pxe_boot(false).await.unwrap();
    driver.power_on().await.unwrap();
    let line = vm
        .wait_for("UNBOUNDED-MARKER", before + 1, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}\n{}", lab_log()));
    assert!(
        line.contains(&format!("unbounded.machine={machine}")),
        "{line}"
    );
    assert_eq!(driver.power_state().await.unwrap(), Power::On);
    // Idempotent: on again changes nothing.
    driver.power_on().await.unwrap();
    assert_eq!(vm.state(), "running");

    driver.set_one_time_pxe_boot(false).await.unwrap();
    driver.power_cycle().await.unwrap();
    vm.wait_for("UNBOUNDED-MARKER", before + 2, BOOT_TIMEOUT)
        .unwrap_or_else(|e| panic!("after the cycle: {e}\n{}", lab_log()));

    // The marker ignores ACPI: the graceful request times out and power is forced off.
    driver.power_off(Duration::from_secs(4)).await.unwrap();
    wait_for_power(driver, Power::Off, &lab_log).await;
    assert_eq!(vm.state(), "shut off");
    driver.power_off(Duration::from_secs(4)).await.unwrap();
}

fn assert_no_password(error: &PowerError) {
    let text = format!("{error} {error:?}");
    assert!(!text.contains(PASSWORD), "{text}");
    assert!(!text.contains("wrong-password"), "{text}");
}

/// One lab (libvirtd is one per machine) for every VM case, in turn.
#[tokio::test(flavor = "multi_thread")]
async fn redfish_and_ipmi_power_vms_into_pxe_boots_cycle_and_power_them_off() {
    let lab = Lab::start();

    // Redfish: sushy-tools driving a libvirt VM.
    let redfish = bmc(&lab.redfish_address(), PASSWORD);
    power_sequence(&redfish, &lab.redfish_vm, "redfish-node", || {
        format!("{}\n{}", lab.sushy.log(), lab.bootserver.log())
    })
    .await;
    // Without a system in the address, an emulator with two VMs is ambiguous: the error
    // says to name one.
    let error = bmc(
        &format!("redfish+http://127.0.0.1:{}", lab.sushy.port),
        PASSWORD,
    )
    .power_state()
    .await
    .unwrap_err();
    assert!(
        error.to_string().contains("name one in the address"),
        "{error}"
    );

    // IPMI: ipmi_sim driving the other VM.
    let ipmi = bmc(&lab.ipmi_address(), PASSWORD);
    power_sequence(&ipmi, &lab.ipmi_vm, "ipmi-node", || {
        format!("{}\n{}", lab.ipmi_sim.log(), lab.bootserver.log())
    })
    .await;
    assert!(
        lab.ipmi_sim.chassis_calls().contains("set boot pxe"),
        "the boot flags reached the chassis: {}",
        lab.ipmi_sim.log()
    );

    // Wrong passwords: refused, said clearly, never echoed.
    let error = bmc(&lab.redfish_address(), "wrong-password")
        .power_state()
        .await
        .unwrap_err();
    assert!(matches!(error, PowerError::Unauthorized { .. }), "{error}");
    assert!(
        error.to_string().contains("refused the credentials"),
        "{error}"
    );
    assert_no_password(&error);
    let error = bmc(&lab.ipmi_address(), "wrong-password")
        .power_state()
        .await
        .unwrap_err();
    assert!(
        matches!(error, PowerError::Unauthorized { .. }),
        "{error:?}"
    );
    assert_no_password(&error);
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_bmcs_fail_after_bounded_retries() {
    // Nothing listens on these ports.
    let closed_tcp = free_port(false).unwrap();
    let closed_udp = free_port(true).unwrap();
    let fast = Backoff {
        first: Duration::from_millis(50),
        max: Duration::from_millis(100),
        attempts: 3,
    };
    let redfish = Bmc::new(
        &BmcAddress::parse(&format!("redfish+http://127.0.0.1:{closed_tcp}")).unwrap(),
        Credentials::new("admin", PASSWORD),
        &Tls::default(),
        Duration::from_secs(2),
    )
    .unwrap();
    let error = with_retries(fast, || redfish.power_state())
        .await
        .unwrap_err();
    assert!(matches!(error, PowerError::Unreachable { .. }), "{error}");
    assert!(error.to_string().contains("unreachable"), "{error}");
    assert_no_password(&error);

    let ipmi = Bmc::new(
        &BmcAddress::parse(&format!("ipmi://127.0.0.1:{closed_udp}")).unwrap(),
        Credentials::new("admin", PASSWORD),
        &Tls::default(),
        Duration::from_secs(1),
    )
    .unwrap();
    let error = with_retries(fast, || ipmi.power_state()).await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
    assert_no_password(&error);
}

/// A BMC that fails in ways the emulators cannot be made to: it answers every request with
/// 500 and a Redfish error body, or accepts connections and never answers.
async fn broken_bmc(answer: bool) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                if answer {
                    let body = r#"{"error":{"message":"internal failure in the BMC"}}"#;
                    let _ = stream
                        .write_all(
                            format!(
                                "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                                body.len()
                            )
                            .as_bytes(),
                        )
                        .await;
                } else {
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
            });
        }
    });
    port
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bmc_that_answers_500_or_never_answers_gives_a_clear_error() {
    let fast = Backoff {
        first: Duration::from_millis(50),
        max: Duration::from_millis(100),
        attempts: 2,
    };
    let failing = bmc(
        &format!(
            "redfish+http://127.0.0.1:{}/redfish/v1/Systems/1",
            broken_bmc(true).await
        ),
        PASSWORD,
    );
    let error = with_retries(fast, || failing.power_on()).await.unwrap_err();
    assert!(
        error.to_string().contains("internal failure in the BMC"),
        "{error}"
    );
    assert_no_password(&error);

    let silent = Bmc::new(
        &BmcAddress::parse(&format!(
            "redfish+http://127.0.0.1:{}/redfish/v1/Systems/1",
            broken_bmc(false).await
        ))
        .unwrap(),
        Credentials::new("admin", PASSWORD),
        &Tls::default(),
        Duration::from_secs(1),
    )
    .unwrap();
    let error = with_retries(fast, || silent.power_state())
        .await
        .unwrap_err();
    assert!(matches!(error, PowerError::Timeout { .. }), "{error}");
    assert!(
        error.to_string().contains("did not answer within 1 s"),
        "{error}"
    );
}

/// Each IPMI call closes the session it opened. A BMC's session table is small (ipmi_sim
/// allows this user 10; real BMCs often fewer), and sessions left to the BMC's inactivity
/// timeout lock out whoever comes next: an operator's `ipmitool`, the console's
/// Serial-over-LAN, the next poll.
#[tokio::test(flavor = "multi_thread")]
async fn each_ipmi_call_closes_the_session_it_opened() {
    let sim = IpmiSim::start("unbounded-no-such-domain", "admin", PASSWORD).unwrap();
    let ipmi = Bmc::new(
        &BmcAddress::parse(&format!("ipmi://127.0.0.1:{}", sim.port)).unwrap(),
        Credentials::new("admin", PASSWORD),
        &Tls::default(),
        Duration::from_secs(2),
    )
    .unwrap();
    // More calls than the user may hold sessions.
    for call in 1..=15 {
        let power = ipmi
            .power_state()
            .await
            .unwrap_or_else(|e| panic!("call {call}: {e}\n{}", sim.log()));
        assert_eq!(power, Power::Off, "the domain does not exist");
    }
    // Only the asking session is left.
    let output = std::process::Command::new("ipmitool")
        .args(["-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p"])
        .arg(sim.port.to_string())
        .args(["-U", "admin", "-E", "session", "info", "active"])
        .env("IPMI_PASSWORD", PASSWORD)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    let count = text
        .lines()
        .find(|l| l.starts_with("active sessions"))
        .and_then(|l| l.rsplit(':').next())
        .map(str::trim)
        .unwrap_or_else(|| panic!("{text}\n{}", String::from_utf8_lossy(&output.stderr)));
    assert_eq!(count, "1", "{text}");
}

/// A leader's IPMI call sends nothing once its term is over. The call runs on tokio's
/// blocking pool, which dropping the leader's work does not stop: here it waits on a frozen
/// `ipmi_sim` while the Lease is taken from the leader, and the simulator is thawed while the
/// call's session could still open. Before the term was checked inside the blocking call,
/// the boot-device command then reached the BMC after the leader had stopped.
#[tokio::test(flavor = "multi_thread")]
async fn a_former_leaders_ipmi_call_sends_nothing_after_its_term() {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::{Api, PostParams};
    use unbounded_runtime::leader::{ElectionConfig, Elector, LostLeadership, Timing};

    let cp = unbounded_testbed::cluster::LocalControlPlane::shared().unwrap();
    let client = cp.client().await.unwrap();
    let sim = IpmiSim::start("unbounded-no-such-domain", "admin", PASSWORD).unwrap();
    let lease_name = "bs-power-term";
    // A long renew deadline, so that the call's first packet waits the driver's whole 5 s
    // (half of what is left of the term, at most) and the thaw below comes well inside it.
    let timing = Timing::new(
        Duration::from_secs(15),
        Duration::from_secs(10),
        Duration::from_secs(1),
    )
    .unwrap();
    let mut elector = Elector::new(
        client.clone(),
        ElectionConfig {
            namespace: "default".into(),
            lease_name: lease_name.into(),
            identity: "bs-leader".into(),
            timing,
        },
    );
    elector.acquire().await;
    let driver = Bmc::new(
        &BmcAddress::parse(&format!("ipmi://127.0.0.1:{}", sim.port)).unwrap(),
        Credentials::new("admin", PASSWORD),
        &Tls::default(),
        Duration::from_secs(5),
    )
    .unwrap()
    .fenced_by(elector.term());

    // While leading, a command goes through.
    elector
        .lead(driver.set_one_time_pxe_boot(false))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{e}\n{}", sim.log()));
    let sent = |calls: &str| calls.matches("set boot pxe").count();
    assert_eq!(sent(&sim.chassis_calls()), 1, "{}", sim.log());

    // The BMC hangs; the leader starts the same command, and the Lease is taken from it.
    sim.freeze().unwrap();
    let usurp = {
        let client = client.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let leases: Api<Lease> = Api::namespaced(client, "default");
            let mut lease = leases.get(lease_name).await.unwrap();
            lease.spec.as_mut().unwrap().holder_identity = Some("bs-usurper".into());
            leases
                .replace(lease_name, &PostParams::default(), &lease)
                .await
                .unwrap();
        }
    };
    let (led, ()) = tokio::join!(elector.lead(driver.set_one_time_pxe_boot(false)), usurp);
    assert!(
        matches!(led, Err(LostLeadership::TakenOver { .. })),
        "{led:?}"
    );
    // The call's thread is still waiting for the frozen BMC's first answer (for up to 5 s).
    // Thawed now, the BMC answers it and a session opens.
    sim.thaw().unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(
        sent(&sim.chassis_calls()),
        1,
        "a command reached the BMC after the leader stopped\n{}",
        sim.log()
    );
    // A call started now is refused at once, without a packet, and never retried.
    let refused = with_retries(Backoff::default(), || driver.power_state())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, PowerError::NotLeading { .. }),
        "{refused}"
    );
    assert_eq!(refused.reason(), "NotLeading");
    assert!(!refused.is_transient());
}
