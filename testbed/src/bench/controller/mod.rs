//! The controller at scale (issue 17): on a fresh local control plane, create the set-up
//! ([`layout`]) with concurrent creates, start the controller binary, and measure
//!
//! 1. **converge**: seconds from the controller's start until every Machine records the
//!    version it should and every version's counts are right, the controller's peak RSS and
//!    CPU time, and the API requests made meanwhile, by verb;
//! 2. **quiet**: the requests in the seconds after convergence (a controller that rewrites
//!    unchanged status keeps making them);
//! 3. **change**: the same for one configuration change that touches
//!    [`Layout::change_racks`] racks of Machines (2,000 in the set-up).
//!
//! The controller runs as the admin user, whom API Priority and Fairness exempts: nothing on
//! the server side slows it down, so the load it puts on the API server is its own doing.
//! The benchmark watches the objects (it never lists them in a loop), which adds three
//! watches' worth of load.

pub mod layout;
pub mod observe;
pub mod probe;
pub mod render;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher;
use serde_json::Value;

use crate::cluster::LocalControlPlane;
use crate::failure::Failure;
use layout::{Expected, Layout, LayoutError};
use observe::{Progress, View};
use probe::RequestCounts;

/// How the benchmark runs.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The set-up.
    pub layout: Layout,
    /// The controller binary (a release build, for figures that mean something).
    pub controller: PathBuf,
    /// Extra arguments for the controller (its rate limits, for example).
    pub controller_args: Vec<String>,
    /// Creates in flight while building the set-up.
    pub create_concurrency: usize,
    /// How long convergence may take before the run is reported as not converged.
    pub converge_timeout: Duration,
    /// How long the change may take to settle.
    pub change_timeout: Duration,
    /// How long to count requests after convergence.
    pub quiet: Duration,
    /// Whether to run the change phase after convergence.
    pub change: bool,
    /// Where the controller's log goes.
    pub log_dir: PathBuf,
}

/// Errors of the benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The layout cannot be benchmarked.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A call to the API server failed.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: kube::Error,
    },
    /// A step failed on another error, which it keeps.
    #[error(transparent)]
    Failed(#[from] Failure),
    /// The controller could not be started or stopped early.
    #[error("{what}: {message}")]
    Controller {
        /// What was being done.
        what: String,
        /// What happened.
        message: String,
    },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
}

fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> BenchError {
    let what = what.into();
    move |source| BenchError::Kube { what, source }
}

/// One sample of the course of a phase.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the phase started.
    pub seconds: f64,
    /// Where the controller was.
    pub progress: Progress,
    /// The controller's RSS, KiB.
    pub rss_kib: u64,
    /// API requests per second since the previous sample.
    pub requests_per_second: f64,
}

/// The figures of one phase.
#[derive(Debug, Clone)]
pub struct Phase {
    /// Seconds until everything was as expected; `None` when time ran out.
    pub seconds: Option<f64>,
    /// The last check.
    pub progress: Progress,
    /// The controller's peak RSS during the phase, KiB.
    pub peak_rss_kib: u64,
    /// The controller's CPU time during the phase, seconds.
    pub cpu_seconds: f64,
    /// kube-apiserver's peak RSS so far, KiB.
    pub apiserver_peak_rss_kib: u64,
    /// kube-apiserver's CPU time during the phase, seconds.
    pub apiserver_cpu_seconds: f64,
    /// etcd's CPU time during the phase, seconds.
    pub etcd_cpu_seconds: f64,
    /// kube-controller-manager's CPU time during the phase, seconds.
    pub kcm_cpu_seconds: f64,
    /// The machine's 1-minute load average at the start and at the end of the phase (other
    /// work on the machine slows everything down).
    pub load_average: (f64, f64),
    /// API requests during the phase.
    pub requests: RequestCounts,
    /// The highest request rate over one sampling interval.
    pub peak_requests_per_second: f64,
    /// Samples taken during the phase.
    pub course: Vec<Sample>,
}

/// Everything the benchmark measured.
#[derive(Debug, Clone)]
pub struct Report {
    /// Seconds the set-up took to create.
    pub setup_seconds: f64,
    /// From the controller's start to convergence.
    pub converge: Phase,
    /// Requests during the quiet period after convergence.
    pub quiet_requests: RequestCounts,
    /// From the configuration change until it settled.
    pub change: Option<Phase>,
    /// The controller's log.
    pub controller_log: PathBuf,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("unbounded-cloud.io", "v1alpha1", kind),
        plural,
    )
}

/// Runs the benchmark on `plane`, which must hold none of the set-up's objects yet.
/// `say` receives progress lines for a person.
pub async fn run(
    plane: &LocalControlPlane,
    settings: &Settings,
    say: &(dyn Fn(String) + Sync),
) -> Result<Report, BenchError> {
    let layout = settings.layout.validate()?;
    let client = plane
        .client()
        .await
        .map_err(|e| Failure::new("connecting to the control plane", e))?;
    let machines = resource("Machine", "machines");
    let configurations = resource("MachineConfiguration", "machineconfigurations");
    let versions = resource(
        "MachineConfigurationVersion",
        "machineconfigurationversions",
    );

    say(format!(
        "creating {} MachineConfigurations and {} Machines ({} creates in flight)",
        layout.configurations, layout.machines, settings.create_concurrency
    ));
    let started = Instant::now();
    create_all(
        &Api::all_with(client.clone(), &configurations),
        (0..layout.configurations).map(|i| layout.configuration_object(i)),
        settings.create_concurrency,
    )
    .await?;
    create_all(
        &Api::all_with(client.clone(), &machines),
        (0..layout.machines).map(|j| layout.machine_object(j)),
        settings.create_concurrency,
    )
    .await?;
    let setup_seconds = started.elapsed().as_secs_f64();
    say(format!("set-up created in {setup_seconds:.1} s"));

    let view = Arc::new(Mutex::new(View::default()));
    let synced = Arc::new(AtomicUsize::new(0));
    let watches = [
        watch_into(
            Api::all_with(client.clone(), &machines),
            view.clone(),
            synced.clone(),
            |v| &mut v.machines,
            observe::machine_view,
        ),
        watch_into(
            Api::all_with(client.clone(), &versions),
            view.clone(),
            synced.clone(),
            |v| &mut v.versions,
            observe::version_view,
        ),
        watch_into(
            Api::all_with(client.clone(), &configurations),
            view.clone(),
            synced.clone(),
            |v| &mut v.configurations,
            observe::configuration_view,
        ),
    ];
    while synced.load(Ordering::SeqCst) < watches.len() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let apiserver = plane.pid("kube-apiserver");
    let etcd = plane.pid("etcd");
    let kcm = plane.pid("kube-controller-manager");
    std::fs::create_dir_all(&settings.log_dir).map_err(|source| BenchError::Io {
        what: format!("creating {}", settings.log_dir.display()),
        source,
    })?;
    let controller_log = settings.log_dir.join("controller.log");
    let metrics_before = request_counts(&client).await?;
    let controller = RunningController::start(plane, settings, &controller_log)?;
    say(format!(
        "started {} (pid {}); its log: {}",
        settings.controller.display(),
        controller.pid,
        controller_log.display()
    ));

    let sampler = Sampler {
        client: &client,
        view: &view,
        controller: controller.pid,
        apiserver,
        etcd,
        kcm,
        say,
    };
    let converge = sampler
        .phase(
            "converge",
            &layout.expected_initial(),
            metrics_before,
            settings.converge_timeout,
        )
        .await?;

    let mut report = Report {
        setup_seconds,
        converge,
        quiet_requests: RequestCounts::new(),
        change: None,
        controller_log,
    };
    if report.converge.seconds.is_some() && settings.change {
        let before = request_counts(&client).await?;
        tokio::time::sleep(settings.quiet).await;
        report.quiet_requests = probe::difference(&before, &request_counts(&client).await?);

        let target = layout
            .change_target()
            .map(|i| layout.configuration_name(i))
            .unwrap_or_default();
        say(format!(
            "changing {target}: new template, priority above all, selector over racks {:?}",
            layout.changed_racks()
        ));
        probe::reset_peak(controller.pid);
        let before = request_counts(&client).await?;
        Api::<DynamicObject>::all_with(client.clone(), &configurations)
            .patch(
                &target,
                &PatchParams::default(),
                &Patch::Merge(layout.change_patch()),
            )
            .await
            .map_err(kube_err(format!("changing {target}")))?;
        report.change = Some(
            sampler
                .phase(
                    "change",
                    &layout.expected_after_change(),
                    before,
                    settings.change_timeout,
                )
                .await?,
        );
    }
    controller.stop();
    for watch in watches {
        watch.abort();
    }
    Ok(report)
}

/// Creates every object, `concurrency` at a time; an object that exists already is fine.
async fn create_all(
    api: &Api<DynamicObject>,
    objects: impl Iterator<Item = Value>,
    concurrency: usize,
) -> Result<(), BenchError> {
    futures::stream::iter(objects.map(Ok))
        .try_for_each_concurrent(concurrency.max(1), |object| async move {
            let name = object["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let object: DynamicObject = serde_json::from_value(object)
                .map_err(|e| Failure::new(format!("building {name}"), e))?;
            let mut attempt = 0;
            loop {
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => return Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => return Ok(()),
                    // Overload (429) or a timeout: back off and try again a few times.
                    Err(kube::Error::Api(s)) if (s.code == 429 || s.code >= 500) && attempt < 5 => {
                        attempt += 1;
                        tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                    }
                    Err(e) => return Err(kube_err(format!("creating {name}"))(e)),
                }
            }
        })
        .await
}

/// Keeps one part of the view up to date from a watch; counts itself in `synced` after its
/// first complete list.
fn watch_into<V: Send + 'static>(
    api: Api<DynamicObject>,
    view: Arc<Mutex<View>>,
    synced: Arc<AtomicUsize>,
    part: fn(&mut View) -> &mut std::collections::HashMap<String, V>,
    read: fn(&Value) -> V,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut relist: std::collections::HashMap<String, V> = Default::default();
        let mut first = true;
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()));
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    tracing::warn!(%error, "benchmark watch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let name = |o: &DynamicObject| o.metadata.name.clone().unwrap_or_default();
            match event {
                watcher::Event::Apply(o) => {
                    let value = read(&o.data);
                    part(&mut view.lock().unwrap_or_else(PoisonError::into_inner))
                        .insert(name(&o), value);
                }
                watcher::Event::Delete(o) => {
                    part(&mut view.lock().unwrap_or_else(PoisonError::into_inner))
                        .remove(&name(&o));
                }
                watcher::Event::Init => relist.clear(),
                watcher::Event::InitApply(o) => {
                    relist.insert(name(&o), read(&o.data));
                }
                watcher::Event::InitDone => {
                    let mut view = view.lock().unwrap_or_else(PoisonError::into_inner);
                    std::mem::swap(part(&mut view), &mut relist);
                    relist.clear();
                    if first {
                        first = false;
                        synced.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        }
    })
}

async fn request_counts(client: &kube::Client) -> Result<RequestCounts, BenchError> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| Failure::new("building the /metrics request", e))?;
    let text = client
        .request_text(request)
        .await
        .map_err(kube_err("reading kube-apiserver's /metrics"))?;
    Ok(probe::parse_request_counts(&text))
}

/// The controller process, started from a thread that outlives it (its parent-death signal
/// is tied to that thread).
struct RunningController {
    pid: u32,
}

impl RunningController {
    fn start(
        plane: &LocalControlPlane,
        settings: &Settings,
        log: &std::path::Path,
    ) -> Result<Self, BenchError> {
        let io = |what: String| move |source| BenchError::Io { what, source };
        let out = std::fs::File::create(log).map_err(io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(io("duplicating a log handle".into()))?;
        let mut command = Command::new("setpriv");
        command
            .args(["--pdeathsig", "KILL", "--"])
            .arg(&settings.controller)
            .args(["--no-leader-election", "--metrics-addr", "127.0.0.1:0"])
            .args(&settings.controller_args)
            .env("KUBECONFIG", plane.kubeconfig_path())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || match command.spawn() {
            Ok(mut child) => {
                let _ = tx.send(Ok(child.id()));
                let _ = child.wait();
            }
            Err(e) => {
                let _ = tx.send(Err(e));
            }
        });
        let pid = rx
            .recv()
            .map_err(|e| Failure::new("starting the controller", e))?
            .map_err(io(format!("starting {}", settings.controller.display())))?;
        Ok(Self { pid })
    }

    fn running(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| !r.trim_start().starts_with('Z'))
        })
    }

    fn stop(&self) {
        // Our own child, by its pid; its thread reaps it.
        let _ = Command::new("kill").arg(self.pid.to_string()).status();
    }
}

struct Sampler<'a> {
    client: &'a kube::Client,
    view: &'a Mutex<View>,
    controller: u32,
    apiserver: Option<u32>,
    etcd: Option<u32>,
    kcm: Option<u32>,
    say: &'a (dyn Fn(String) + Sync),
}

fn cpu_of(pid: Option<u32>) -> f64 {
    pid.and_then(probe::cpu_seconds).unwrap_or(0.0)
}

const CHECK_EVERY: Duration = Duration::from_millis(250);
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

impl Sampler<'_> {
    async fn phase(
        &self,
        name: &str,
        expected: &Expected,
        metrics_before: RequestCounts,
        timeout: Duration,
    ) -> Result<Phase, BenchError> {
        let started = Instant::now();
        let cpu_before = probe::cpu_seconds(self.controller).unwrap_or(0.0);
        let apiserver_cpu_before = cpu_of(self.apiserver);
        let etcd_cpu_before = cpu_of(self.etcd);
        let kcm_cpu_before = cpu_of(self.kcm);
        let load_before = probe::load_average().unwrap_or(0.0);
        let mut course = Vec::new();
        let mut last_sample = (started, metrics_before.clone());
        let mut peak_rate: f64 = 0.0;
        let (seconds, progress) = loop {
            tokio::time::sleep(CHECK_EVERY).await;
            let progress = {
                let view = self.view.lock().unwrap_or_else(PoisonError::into_inner);
                observe::check(&view, expected)
            };
            let elapsed = started.elapsed();
            if progress.done() {
                break (Some(elapsed.as_secs_f64()), progress);
            }
            if elapsed > timeout {
                break (None, progress);
            }
            if !(RunningController {
                pid: self.controller,
            })
            .running()
            {
                return Err(BenchError::Controller {
                    what: format!("during {name}"),
                    message: "the controller exited; see its log".into(),
                });
            }
            if last_sample.0.elapsed() >= SAMPLE_EVERY {
                let now = request_counts(self.client).await?;
                let grown: u64 = probe::by_verb(&probe::difference(&last_sample.1, &now))
                    .values()
                    .sum();
                let rate = grown as f64 / last_sample.0.elapsed().as_secs_f64();
                peak_rate = peak_rate.max(rate);
                let rss_kib = probe::memory(self.controller).map_or(0, |m| m.rss_kib);
                (self.say)(format!(
                    "{name} {:6.1} s: {:5}/{} Machines resolved, {:5} as expected, {}/{} version counts right, controller RSS {:4} MiB, {:5.0} API requests/s",
                    elapsed.as_secs_f64(),
                    progress.resolved,
                    progress.machines,
                    progress.as_expected,
                    progress.versions_right,
                    progress.versions,
                    rss_kib / 1024,
                    rate,
                ));
                course.push(Sample {
                    seconds: elapsed.as_secs_f64(),
                    progress,
                    rss_kib,
                    requests_per_second: rate,
                });
                last_sample = (Instant::now(), now);
            }
        };
        let metrics_after = request_counts(self.client).await?;
        let tail = probe::by_verb(&probe::difference(&last_sample.1, &metrics_after))
            .values()
            .sum::<u64>() as f64
            / last_sample.0.elapsed().as_secs_f64().max(0.001);
        if last_sample.0.elapsed() >= Duration::from_secs(1) {
            peak_rate = peak_rate.max(tail);
        }
        let memory = probe::memory(self.controller).unwrap_or_default();
        match seconds {
            Some(s) => (self.say)(format!("{name}: done in {s:.1} s")),
            None => (self.say)(format!(
                "{name}: not done after {} s: {}",
                timeout.as_secs(),
                progress.first_problem.as_deref().unwrap_or_default()
            )),
        }
        Ok(Phase {
            seconds,
            progress,
            peak_rss_kib: memory.peak_kib,
            cpu_seconds: probe::cpu_seconds(self.controller).unwrap_or(0.0) - cpu_before,
            apiserver_peak_rss_kib: self
                .apiserver
                .and_then(probe::memory)
                .map_or(0, |m| m.peak_kib),
            apiserver_cpu_seconds: cpu_of(self.apiserver) - apiserver_cpu_before,
            etcd_cpu_seconds: cpu_of(self.etcd) - etcd_cpu_before,
            kcm_cpu_seconds: cpu_of(self.kcm) - kcm_cpu_before,
            load_average: (load_before, probe::load_average().unwrap_or(0.0)),
            requests: probe::difference(&metrics_before, &metrics_after),
            peak_requests_per_second: peak_rate,
            course,
        })
    }
}
