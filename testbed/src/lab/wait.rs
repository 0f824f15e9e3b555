//! Waiting for the lab's machines to become Ready Nodes, with what is known when one does
//! not.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::base::{LabError, step};
use super::{Lab, LabMachine};
use crate::process::tail_text;
use crate::progress::{self, Stage, Timeline};

impl Lab {
    /// Follows every machine until its Node is Ready, printing each stage as it is reached;
    /// a stage that takes longer than `stage_timeout` fails with the console and log tails.
    pub fn wait_ready(
        &mut self,
        stage_timeout: Duration,
        say: &dyn Fn(&str),
    ) -> Result<Vec<(String, Timeline)>, LabError> {
        let mut timelines: Vec<(String, Timeline)> = self
            .machines
            .iter()
            .map(|m| (m.name.clone(), Timeline::default()))
            .collect();
        let mut last_progress: Vec<Instant> = vec![Instant::now(); self.machines.len()];
        let mut reasons: BTreeMap<String, String> = BTreeMap::new();
        loop {
            if let Some(message) = self.component_exited() {
                return Err(step(format!("{message}\n{}", self.logs())));
            }
            let nodes = self.nodes();
            let mut all_ready = true;
            for (i, m) in self.machines.iter().enumerate() {
                let timeline = &mut timelines[i].1;
                let on = self
                    .powered_on
                    .get(&m.name)
                    .copied()
                    .or_else(|| (m.domain.state() == "running").then(Instant::now));
                let Some(on) = on else {
                    all_ready = false;
                    if last_progress[i].elapsed() > stage_timeout {
                        return Err(self.timeout(m, Stage::PoweredOn, timeline, stage_timeout));
                    }
                    continue;
                };
                self.powered_on.entry(m.name.clone()).or_insert(on);
                let mut stages = vec![Stage::PoweredOn];
                stages.extend(progress::console_stages(&m.domain.console()));
                match nodes.get(&m.name) {
                    Some((true, _)) => stages.extend([Stage::NodeRegistered, Stage::Ready]),
                    Some((false, message)) => {
                        stages.push(Stage::NodeRegistered);
                        // Why it is not Ready yet, each time kubelet says something new.
                        if reasons.get(&m.name) != Some(message) && !message.is_empty() {
                            say(&format!("{:<12} not Ready yet: {message}", m.name));
                            reasons.insert(m.name.clone(), message.clone());
                        }
                    }
                    None => {}
                }
                for stage in stages {
                    if timeline.record(stage, on.elapsed()) {
                        last_progress[i] = Instant::now();
                        say(&format!(
                            "{:<12} {:<16} {:>6.1} s",
                            m.name,
                            stage.label(),
                            on.elapsed().as_secs_f64()
                        ));
                    }
                }
                if timeline.at(Stage::Ready).is_none() {
                    all_ready = false;
                    if last_progress[i].elapsed() > stage_timeout {
                        let next = Stage::ALL
                            .iter()
                            .copied()
                            .find(|s| timeline.at(*s).is_none())
                            .unwrap_or(Stage::Ready);
                        return Err(self.timeout(m, next, timeline, stage_timeout));
                    }
                }
            }
            if all_ready {
                return Ok(timelines);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    fn timeout(
        &self,
        m: &LabMachine,
        stage: Stage,
        timeline: &Timeline,
        limit: Duration,
    ) -> LabError {
        LabError::Timeout {
            machine: m.name.clone(),
            stage: stage.label(),
            seconds: limit.as_secs(),
            last: timeline.last().map_or("none", Stage::label),
            console: tail_text(&m.domain.console(), 60),
            logs: self.logs(),
        }
    }

    /// Node name → (Ready, the Ready condition's message), for every Node.
    pub fn nodes(&self) -> BTreeMap<String, (bool, String)> {
        use crate::scenario::LabAccess as _;
        let out = self
            .kubectl(
                &[
                    "get",
                    "nodes",
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name}\t{.status.conditions[?(@.type==\"Ready\")].status}\t{.status.conditions[?(@.type==\"Ready\")].message}{\"\\n\"}{end}",
                ],
                None,
            )
            .unwrap_or_default();
        out.lines()
            .filter_map(|l| {
                let mut parts = l.splitn(3, '\t');
                let name = parts.next()?;
                let ready = parts.next()? == "True";
                let message = parts.next().unwrap_or_default();
                Some((name.to_owned(), (ready, message.to_owned())))
            })
            .collect()
    }
}
