//! The command line: `kubectl unbounded <command>` (kubectl runs `kubectl-unbounded` from
//! `PATH` with the words after `unbounded`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Unbounded's Machines from kubectl: what they are doing, why one is stuck, and the day-2
/// verbs (reboot, power, repave, rollback) as the objects the controller acts on.
#[derive(Parser, Debug)]
#[command(name = "kubectl-unbounded", bin_name = "kubectl unbounded", version)]
pub struct Cli {
    /// The kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

/// What to do.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// A tree of configurations → versions → machines (or pools → machines) with each
    /// machine's phase, version, Node, power, agent and what holds it up.
    Status(StatusArgs),
    /// Why a machine is not Running: its first blocking condition, recent Events and the
    /// agent's last report, in one paragraph.
    Why(WhyArgs),
    /// Reboot the machines' OS (the agent carries it out; done when the machine is back).
    Reboot(VerbArgs),
    /// Shut the machines' OS down (the agent carries it out).
    Shutdown(VerbArgs),
    /// Switch power through the machines' provider (BMC for PXE, Azure for VMs).
    Power(PowerArgs),
    /// Set a one-time network boot and power-cycle (PXE machines with a BMC).
    PxeBoot(VerbArgs),
    /// Restart a systemd unit on the machines (the agent carries it out).
    RestartService(RestartServiceArgs),
    /// Repave: drain and delete the Node; the agent repaves the node container with the
    /// version the Machine resolves to.
    Repave(RepaveArgs),
    /// Roll one machine back (or forward) to a configuration version: pin it, then repave.
    Rollback(RollbackArgs),
    /// Move the machines to the configuration version they resolve to without a repave
    /// (an `applyConfiguration` operation: Node labels and taints in place); a change that
    /// needs a repave only with --disruptive.
    Apply(ApplyArgs),
    /// The machine's log lines: the bootserver's that name it (pods/log) and its agent's
    /// (served by its Node's kubelet).
    Logs(LogsArgs),
    /// The machine's serial console through its BMC (IPMI Serial-over-LAN, also where a
    /// Redfish BMC advertises it), read-only unless --interactive.
    Console(ConsoleArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(CompletionArgs),
    /// kubectl's plugin completion protocol: prints candidates for the last word (used by
    /// the `kubectl_complete-unbounded` script; see docs/kubectl-plugin.md).
    #[command(name = "__complete", hide = true)]
    Complete(CompleteArgs),
}

// How `status` groups machines: the status room's own (it imports nothing of the CLI).
pub use crate::status::GroupBy;

/// Output formats of `status`.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Output {
    /// The tree, for people.
    #[default]
    Text,
    /// The tree as JSON (one document; one line per snapshot with --watch).
    Json,
    /// The tree as YAML.
    Yaml,
}

/// When to colour the output.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ColorChoice {
    /// When standard output is a terminal and NO_COLOR is not set.
    #[default]
    Auto,
    /// Always.
    Always,
    /// Never.
    Never,
}

/// `status`.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// Only these machines.
    pub machines: Vec<String>,
    /// Only machines whose labels match this selector (kubectl syntax: `rack=r1,tier!=gpu`).
    #[arg(short = 'l', long = "selector")]
    pub selector: Option<String>,
    /// Only the machines of this pool (implies --by pool).
    #[arg(long)]
    pub pool: Option<String>,
    /// Only the machines of this configuration (recorded or resolved).
    #[arg(long)]
    pub configuration: Option<String>,
    /// Group by configuration (configurations → versions → machines) or by pool.
    #[arg(long, value_enum, default_value_t)]
    pub by: GroupBy,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t)]
    pub output: Output,
    /// Redraw whenever a Machine, configuration, pool or Node changes (Ctrl-C ends).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// Colour the output.
    #[arg(long, value_enum, default_value_t)]
    pub color: ColorChoice,
}

/// `why`.
#[derive(Args, Debug)]
pub struct WhyArgs {
    /// The machine.
    pub machine: String,
    /// How many recent Events to show.
    #[arg(long, default_value_t = 5)]
    pub events: usize,
}

/// Which machines a verb acts on, and how.
#[derive(Args, Debug, Clone)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["machines", "selector"])))]
pub struct VerbArgs {
    /// The machines to act on.
    pub machines: Vec<String>,
    /// Act on every machine whose labels match this selector (kubectl syntax).
    #[arg(short = 'l', long = "selector", conflicts_with = "machines")]
    pub selector: Option<String>,
    #[command(flatten)]
    pub act: ActArgs,
}

/// How a verb acts.
#[derive(Args, Debug, Clone)]
pub struct ActArgs {
    /// Print what would be created or changed, and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not ask for confirmation.
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Ask for confirmation when more machines than this are affected.
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub confirm_above: usize,
    /// Return once the objects are created, without following them.
    #[arg(long)]
    pub no_wait: bool,
    /// Stop following after this many seconds (the work goes on; exit code 1).
    #[arg(long, value_name = "SECONDS", default_value_t = 1800)]
    pub timeout: u64,
    /// MachineOperations fail when not finished this many seconds after their creation
    /// (`spec.activeDeadlineSeconds`; the API's default is 600).
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(i64).range(1..=604_800))]
    pub active_deadline: Option<i64>,
}

/// `power`.
#[derive(Args, Debug)]
pub struct PowerArgs {
    /// on, off or cycle.
    #[arg(value_enum)]
    pub action: PowerAction,
    #[command(flatten)]
    pub target: VerbArgs,
    /// With `off` on Azure machines: deallocate the VM (its compute is released, not billed).
    #[arg(long)]
    pub deallocate: bool,
}

/// What `power` does.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PowerAction {
    /// Power on.
    On,
    /// Power off.
    Off,
    /// Power off and on.
    Cycle,
}

/// `repave`.
#[derive(Args, Debug)]
pub struct RepaveArgs {
    /// Once the Node is deleted, also power the machine off or network-boot it again (PXE
    /// machines with a BMC: a fresh host OS).
    #[arg(long, value_enum)]
    pub then: Option<RepaveThen>,
    #[command(flatten)]
    pub target: VerbArgs,
}

/// What follows a repave.
#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum RepaveThen {
    /// Power off (`powerOff`).
    PowerOff,
    /// One-time network boot and power cycle (`pxeBoot`).
    PxeBoot,
}

/// `restart-service`.
#[derive(Args, Debug)]
pub struct RestartServiceArgs {
    /// The systemd unit to restart, such as kubelet.service.
    #[arg(long)]
    pub service: String,
    #[command(flatten)]
    pub target: VerbArgs,
}

/// `rollback`.
#[derive(Args, Debug)]
pub struct RollbackArgs {
    /// The machine.
    pub machine: String,
    /// The configuration version to run (it must exist).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..))]
    pub to: i64,
    #[command(flatten)]
    pub act: ActArgs,
}

/// `apply`.
#[derive(Args, Debug)]
pub struct ApplyArgs {
    /// The version the machines must resolve to (they are moved only to the version they
    /// resolve to; pin it first, or use `rollback`, to move them elsewhere).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i64).range(1..))]
    pub version: Option<i64>,
    /// Allow a change that needs a repave: the machine is cordoned, drained, its Node
    /// deleted and the node container repaved.
    #[arg(long)]
    pub disruptive: bool,
    #[command(flatten)]
    pub target: VerbArgs,
}

/// `logs`.
#[derive(Args, Debug)]
pub struct LogsArgs {
    /// The machine.
    pub machine: String,
    /// Keep printing new lines (Ctrl-C ends).
    #[arg(short = 'f', long)]
    pub follow: bool,
    /// Only lines of this recent past: 90s, 15m, 2h, 1d.
    #[arg(long, value_name = "DURATION", value_parser = crate::logs::parse_since)]
    pub since: Option<i64>,
    /// The namespace of the bootserver's pods.
    #[arg(long, value_name = "NAMESPACE", default_value = crate::logs::BOOTSERVER_NAMESPACE)]
    pub bootserver_namespace: String,
}

/// `console`.
#[derive(Args, Debug)]
pub struct ConsoleArgs {
    /// The machine.
    pub machine: String,
    /// Send what is typed to the machine (`~.` ends the session).
    #[arg(long)]
    pub interactive: bool,
}

/// `completion`.
#[derive(Args, Debug)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `__complete`.
#[derive(Args, Debug)]
pub struct CompleteArgs {
    /// The words after `kubectl unbounded`, the last one being completed (may be empty).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub words: Vec<String>,
}
