//! Servers and clients run by the benchmarks inside a namespace: started with
//! `ip netns exec <ns> setpriv --pdeathsig KILL -- <program>` (both exec, so the child's pid
//! is the program's own and `/proc/<pid>` measures it), their output in a log file, killed
//! and reaped on drop.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::bench::controller::probe;
use crate::netns::Netns;

/// Errors of starting, waiting for or running a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// It could not be started.
    #[error("starting {program}: {source}")]
    Start {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// It did not become ready in time, or exited.
    #[error("{program} {what}; the end of its log ({log}):\n{tail}")]
    NotReady {
        /// The program.
        program: String,
        /// What happened.
        what: String,
        /// Its log file.
        log: String,
        /// The log's last lines.
        tail: String,
    },
    /// A client exited with an error.
    #[error("{command} failed ({status}):\n{output}")]
    Failed {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// The end of its output.
        output: String,
    },
    /// A file could not be read or written.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        source: std::io::Error,
    },
}

/// `ip netns exec <ns> setpriv --pdeathsig KILL -- <program>`.
pub fn in_namespace(ns: &Netns, program: &str) -> Command {
    let mut command = ns.command("setpriv");
    command.args(["--pdeathsig", "KILL", "--", program]);
    command
}

/// A server process in a namespace.
#[derive(Debug)]
pub struct Daemon {
    /// Its name in messages (`kea-dhcp4`, `ours`, …).
    pub name: String,
    child: Child,
    log: PathBuf,
    started: Instant,
    /// The CPU accounting group it was moved into at its start, when the host has one.
    group: Option<CpuGroup>,
}

impl Daemon {
    /// Starts `command` with its stdout and stderr in `log`, in a CPU accounting group of
    /// its own when the host has one ([`CpuGroup`]).
    pub fn start(name: &str, command: Command, log: &Path) -> Result<Self, ProcError> {
        let io = |source| ProcError::Io {
            what: format!("creating {}", log.display()),
            source,
        };
        let file = std::fs::File::create(log).map_err(io)?;
        let err = file.try_clone().map_err(io)?;
        let group = CpuGroup::create(name);
        let mut command = match &group {
            Some(group) => group.join_then_exec(&command),
            None => command,
        };
        let child = command
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .spawn()
            .map_err(|source| ProcError::Start {
                program: name.to_owned(),
                source,
            })?;
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_owned(),
            started: Instant::now(),
            group,
        })
    }

    /// The process id (the program's own: the group's shell, `ip netns exec` and `setpriv`
    /// exec it).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its CPU time so far, seconds.
    pub fn cpu_seconds(&self) -> f64 {
        probe::cpu_seconds(self.pid()).unwrap_or(0.0)
    }

    /// The CPU time so far of it and every process it started (nginx's workers, tftpd-hpa's
    /// forked transfers), seconds: what the server as a whole spent. From its CPU
    /// accounting group when it has one (a transfer that exited is counted there whoever
    /// reaped it: tftpd-hpa's are not its own to reap, and `/proc` showed 0.00 s for them),
    /// else from `/proc`.
    pub fn tree_cpu_seconds(&self) -> f64 {
        if let Some(seconds) = self.group.as_ref().and_then(CpuGroup::cpu_seconds) {
            return seconds;
        }
        let entries = std::fs::read_dir("/proc").map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|entry| {
                    let name = entry.file_name();
                    name.to_str()?.parse::<u32>().ok()?;
                    std::fs::read_to_string(entry.path().join("stat")).ok()
                })
                .filter_map(|text| ProcStat::parse(&text))
                .collect::<Vec<_>>()
        });
        tree_ticks(&entries.unwrap_or_default(), self.pid()) as f64 / 100.0
    }

    /// Its peak resident memory so far, KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        probe::memory(self.pid()).map_or(0, |m| m.peak_kib)
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    fn not_ready(&mut self, what: String) -> ProcError {
        ProcError::NotReady {
            program: self.name.clone(),
            what,
            log: self.log.display().to_string(),
            tail: self.log_tail(20),
        }
    }

    /// Waits until the process listens on `port` (TCP, or a bound UDP socket), as its own
    /// namespace's `/proc/<pid>/net` shows.
    pub fn wait_listening(
        &mut self,
        port: u16,
        udp: bool,
        timeout: Duration,
    ) -> Result<(), ProcError> {
        self.wait_in_table(if udp { "udp" } else { "tcp" }, port, !udp, timeout)
    }

    /// Waits until the process has a UDP socket bound on `port` over IPv6
    /// (`/proc/<pid>/net/udp6`: DHCPv6 servers).
    pub fn wait_listening_udp6(&mut self, port: u16, timeout: Duration) -> Result<(), ProcError> {
        self.wait_in_table("udp6", port, false, timeout)
    }

    fn wait_in_table(
        &mut self,
        table: &str,
        port: u16,
        tcp: bool,
        timeout: Duration,
    ) -> Result<(), ProcError> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(self.not_ready(format!("exited ({status}) before listening")));
            }
            let text = std::fs::read_to_string(format!("/proc/{}/net/{table}", self.pid()))
                .unwrap_or_default();
            if listens(&text, port, tcp) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(self.not_ready(format!(
                    "was not listening on {table} port {port} after {:.0} s",
                    self.started.elapsed().as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// `kill -9` and reap (the crash test).
    pub fn kill_hard(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after a grace period; reaped either way.
    pub fn stop(&mut self) {
        if !self.running() {
            return;
        }
        let _ = Command::new("kill")
            .arg(self.pid().to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_hard();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
        if let Some(group) = &self.group {
            group.remove();
        }
    }
}

/// A cgroup that accounts CPU time: v1's `cpuacct` hierarchy, or the unified (v2) one.
#[derive(Debug)]
pub struct CpuGroup {
    dir: PathBuf,
    unified: bool,
}

impl CpuGroup {
    /// A new group for `name` (made unique); `None` when the host has no hierarchy that can
    /// make one.
    pub fn create(name: &str) -> Option<Self> {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "unbounded-bench-{}-{name}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let root = Path::new("/sys/fs/cgroup");
        let (base, unified) = if root.join("cpuacct/cpuacct.usage").exists() {
            (root.join("cpuacct"), false)
        } else if root.join("cgroup.controllers").exists() {
            (root.to_owned(), true)
        } else {
            return None;
        };
        let dir = base.join(&name);
        std::fs::create_dir(&dir).ok()?;
        Some(Self { dir, unified })
    }

    /// `command`, run by a shell that first moves itself into the group and then execs it:
    /// nothing the program forks can start outside the group (moving its pid after the
    /// spawn raced nginx's workers: they were forked before, and nginx's CPU read 0.00 s).
    pub fn join_then_exec(&self, command: &Command) -> Command {
        let mut joined = Command::new("sh");
        joined
            .args(["-c", r#"echo $$ > "$0" && exec "$@""#])
            .arg(self.dir.join("cgroup.procs"))
            .arg(command.get_program())
            .args(command.get_args());
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => joined.env(key, value),
                None => joined.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            joined.current_dir(dir);
        }
        joined
    }

    /// The CPU time of every process that was ever in the group, seconds.
    pub fn cpu_seconds(&self) -> Option<f64> {
        if self.unified {
            let stat = std::fs::read_to_string(self.dir.join("cpu.stat")).ok()?;
            parse_usage_usec(&stat).map(|usec| usec as f64 / 1e6)
        } else {
            let usage = std::fs::read_to_string(self.dir.join("cpuacct.usage")).ok()?;
            usage.trim().parse::<u64>().ok().map(|ns| ns as f64 / 1e9)
        }
    }

    /// Removes the group (once its processes are gone; else it stays, empty of meaning).
    pub fn remove(&self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// `usage_usec` of a v2 `cpu.stat`.
fn parse_usage_usec(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|line| line.strip_prefix("usage_usec "))
        .and_then(|value| value.trim().parse().ok())
}

/// What the CPU accounting needs of one `/proc/<pid>/stat` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// The process.
    pub pid: u32,
    /// Its parent.
    pub ppid: u32,
    /// Its own user + system time, clock ticks.
    pub ticks: u64,
    /// Its reaped children's user + system time (`cutime` + `cstime`), clock ticks.
    pub children_ticks: u64,
}

impl ProcStat {
    /// Parses a `/proc/<pid>/stat` line; `None` when it is not one.
    pub fn parse(stat: &str) -> Option<Self> {
        let (head, rest) = stat.rsplit_once(')')?;
        let pid = head.split_whitespace().next()?.parse().ok()?;
        // After the command name: state, ppid, …, utime (14), stime, cutime, cstime (17).
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let field = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
        Some(Self {
            pid,
            ppid: u32::try_from(field(1)?).ok()?,
            ticks: field(11)? + field(12)?,
            children_ticks: field(13)? + field(14)?,
        })
    }
}

/// The CPU ticks of `root` and its descendants among `procs`: each live process's own time,
/// plus what the root has reaped (its children's time ends up there when they exit).
/// Descendants' reaped children are counted through them; nothing is counted twice.
pub fn tree_ticks(procs: &[ProcStat], root: u32) -> u64 {
    let mut inside = std::collections::BTreeSet::from([root]);
    // Parents may come after their children in /proc's order: repeat until no process joins.
    loop {
        let before = inside.len();
        for p in procs {
            if inside.contains(&p.ppid) {
                inside.insert(p.pid);
            }
        }
        if inside.len() == before {
            break;
        }
    }
    procs
        .iter()
        .filter(|p| inside.contains(&p.pid))
        .map(|p| p.ticks + p.children_ticks)
        .sum()
}

/// Whether a `/proc/net/{tcp,udp}` table has a socket on local `port` (TCP: in LISTEN).
pub fn listens(table: &str, port: u16, tcp: bool) -> bool {
    let hex = format!(":{port:04X}");
    table.lines().skip(1).any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let local = fields.get(1).copied().unwrap_or_default();
        let state = fields.get(3).copied().unwrap_or_default();
        local.ends_with(&hex) && (!tcp || state == "0A")
    })
}

/// The last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs a client to completion and returns its stdout; fails with the end of its output on
/// a non-zero exit.
pub fn run_client(mut command: Command) -> Result<String, ProcError> {
    let line = format!("{command:?}");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|source| ProcError::Start {
            program: line.clone(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let both = format!("{stdout}\n{stderr}");
        let lines: Vec<&str> = both.lines().collect();
        return Err(ProcError::Failed {
            command: line,
            status: output.status.to_string(),
            output: lines[lines.len().saturating_sub(20)..].join("\n"),
        });
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0161610A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0000000000000000 100 0 0 10 0
   1: 0161610A:0045 0261610A:9C40 01 00000000:00000000 00:00000000 00000000     0        0 2 1 0000000000000000 100 0 0 10 0
";

    #[test]
    fn a_stat_line_gives_parent_and_times() {
        // A command name with spaces and parentheses, as `/proc` writes it.
        let line = "4242 (nginx: worker (x)) S 4241 4241 1 0 -1 4194624 100 0 0 0 \
                    120 30 7 3 20 0 1 0 555 1000000 300 18446744073709551615";
        assert_eq!(
            ProcStat::parse(line),
            Some(ProcStat {
                pid: 4242,
                ppid: 4241,
                ticks: 150,
                children_ticks: 10,
            })
        );
        assert_eq!(ProcStat::parse("garbage"), None);
        assert_eq!(ProcStat::parse("1 (init) S"), None);
    }

    #[test]
    fn a_tree_counts_the_root_its_descendants_and_what_they_reaped() {
        let stat = |pid, ppid, ticks, children_ticks| ProcStat {
            pid,
            ppid,
            ticks,
            children_ticks,
        };
        let procs = [
            // A grandchild listed before its parent.
            stat(12, 11, 5, 0),
            stat(10, 1, 100, 40),
            stat(11, 10, 50, 2),
            stat(13, 10, 7, 0),
            // Not ours: the parent of the root, and an unrelated process.
            stat(1, 0, 1000, 1000),
            stat(20, 1, 9, 0),
        ];
        assert_eq!(tree_ticks(&procs, 10), 100 + 40 + 50 + 2 + 5 + 7);
        assert_eq!(tree_ticks(&procs, 11), 57);
        // A root that is gone counts nothing.
        assert_eq!(tree_ticks(&procs, 99), 0);
    }

    #[test]
    fn bound_udp6_sockets_are_found_by_port() {
        // `/proc/net/udp6` of a DHCPv6 server: ff02::1:2 and a link-local address, port 547.
        let udp6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  100: 000002FF000000000000000002000100:0223 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 1 2 0000000000000000 0
  101: 000080FE00000000FF01DB68FEABE0FE:0223 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 2 2 0000000000000000 0
";
        assert!(listens(udp6, 547, false));
        assert!(!listens(udp6, 546, false));
    }

    #[test]
    fn listening_sockets_are_found_by_port_and_state() {
        assert!(listens(TCP, 8080, true));
        // Port 69 is only an established connection, not a listener.
        assert!(!listens(TCP, 69, true));
        // A bound UDP socket has no LISTEN state.
        assert!(listens(TCP, 69, false));
        assert!(!listens(TCP, 67, false));
        assert!(!listens("", 8080, true));
    }

    #[test]
    fn a_group_counts_what_its_process_forked_and_left_behind() {
        let group = CpuGroup::create("test")
            .expect("a CPU accounting cgroup (root, cgroup v1 cpuacct or v2)");
        // The shell forks a busy child at once and exits: nobody in the group reaps it, the
        // way tftpd-hpa's transfers are not its own to reap. The child works until it has
        // used 30 ticks (0.3 s) of CPU by its own account (`/proc/<pid>/stat`, read with the
        // shell's builtin so that it forks nothing), however long the scheduler takes to
        // give it that: the test is about what the group counts, not about how busy the
        // machine is.
        let mut busy = Command::new("sh");
        busy.args([
            "-c",
            r#"(exec sh -c 'while :; do read -r line < /proc/$$/stat; set -- $line; [ $((${14} + ${15})) -ge 30 ] && exit 0; done') & exit 0"#,
        ]);
        let mut shell = group.join_then_exec(&busy).spawn().unwrap();
        shell.wait().unwrap();
        // Waits for the work, not for a time: the group must come to count the child's
        // 0.3 s (less one tick of rounding per field), and a group that does not count it
        // never does.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seconds = group.cpu_seconds().unwrap();
        while seconds < 0.28 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            seconds = group.cpu_seconds().unwrap();
        }
        assert!(
            seconds >= 0.28,
            "the group counted {seconds} s of the child's 0.3 s"
        );
        group.remove();
        assert_eq!(
            parse_usage_usec("usage_usec 1500000\nuser_usec 1\n"),
            Some(1_500_000)
        );
        assert_eq!(parse_usage_usec("nr_periods 0\n"), None);
    }
}
