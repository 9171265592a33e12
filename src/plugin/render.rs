//! What `kubectl ballast` prints, as pure functions of what it read: the status tree of a
//! RolloutStrategy, its progress bar, the next command to type, the verdict of `wait`, and the
//! table of `spread`. No I/O and no clock here: `now` and the terminal's abilities are inputs.

use crate::api::rollout_strategy::{
    ABORT_ANNOTATION, APPROVE_ANNOTATION, RETRY_ANNOTATION, progress_point,
};
use crate::api::{
    HookPhase, HookPoint, HookStatus, RolloutPhase, RolloutStrategy, RolloutStrategyStatus,
};
use crate::controller::rollout_strategy::machine::phase_name;
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write;

/// How to draw: colour (ANSI) and Unicode symbols on a terminal, plain ASCII otherwise.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Style {
    pub color: bool,
    pub unicode: bool,
}

impl Style {
    /// A terminal: colour and symbols.
    pub const TTY: Style = Style {
        color: true,
        unicode: true,
    };
    /// A pipe or a file: plain text.
    pub const PLAIN: Style = Style {
        color: false,
        unicode: false,
    };

    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    fn sym(&self, unicode: &'static str, ascii: &'static str) -> &'static str {
        if self.unicode { unicode } else { ascii }
    }
}

/// One container whose image the revision changes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImageChange {
    pub container: String,
    pub from: Option<String>,
    pub to: String,
}

/// The images of `current` (a pod template) that differ from those of `stable` (the
/// strategy's `status.stableTemplate`), by container name.
pub fn image_changes(
    stable: Option<&serde_json::Value>,
    current: &serde_json::Value,
) -> Vec<ImageChange> {
    use crate::controller::rollout_strategy::webhook::images;
    let old = stable.map(images).unwrap_or_default();
    images(current)
        .into_iter()
        .filter(|(name, image)| old.get(name) != Some(image))
        .map(|(container, to)| ImageChange {
            from: old.get(&container).cloned(),
            container,
            to,
        })
        .collect()
}

/// What `status` shows besides the strategy itself, read from the cluster.
#[derive(Clone, Debug, Default)]
pub struct Extra {
    /// Images the current revision changes.
    pub images: Vec<ImageChange>,
    /// `spec.replicas` of the Deployment (else the strategy's `desiredReplicas`).
    pub desired: Option<i32>,
    /// Available replicas of the current revision's ReplicaSet.
    pub new_available: Option<i32>,
    /// Pod of each hook Job, by Job name.
    pub pods: BTreeMap<String, String>,
}

/// `1h2m`, `4m05s`, `12s`: a duration for people.
pub fn human(d: SignedDuration) -> String {
    let s = d.as_secs().max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// A bar of `width` cells for `desired` replicas: new and available (`█`/`#`), new and not
/// available yet (`▒`/`+`), the rest (`░`/`.`); below it, a `^` under each mid point with its
/// hook's name. Returns the two lines (the second empty without marks).
pub fn progress_bar(
    desired: i32,
    updated: i32,
    new_available: i32,
    marks: &[(String, i32)],
    width: usize,
    style: Style,
) -> (String, String) {
    let desired = desired.max(0);
    let cell = |n: i32| -> usize {
        if desired == 0 {
            return 0;
        }
        let n = n.clamp(0, desired) as usize;
        (n * width).div_ceil(desired as usize).min(width)
    };
    let avail = cell(new_available.min(updated));
    let upd = cell(updated).max(avail);
    let mut bar = String::new();
    bar.push_str(&style.paint("32", &style.sym("█", "#").repeat(avail)));
    bar.push_str(&style.paint("33", &style.sym("▒", "+").repeat(upd - avail)));
    bar.push_str(&style.sym("░", ".").repeat(width - upd));
    let line = format!("[{bar}] {updated}/{desired} updated, {new_available} available");
    let mut below = vec![' '; width + 2];
    let mut names = vec![];
    for (name, at) in marks {
        let pos = 1 + cell(*at).saturating_sub(1).min(width.saturating_sub(1));
        if let Some(c) = below.get_mut(pos) {
            *c = '^';
        }
        names.push(format!("{name}@{at}"));
    }
    let marks_line = if marks.is_empty() {
        String::new()
    } else {
        format!(
            "{}  {}",
            below.into_iter().collect::<String>().trim_end(),
            names.join(" ")
        )
    };
    (line, marks_line)
}

fn phase_symbol(phase: RolloutPhase, style: Style) -> String {
    match phase {
        RolloutPhase::Succeeded | RolloutPhase::Idle => style.paint("32", style.sym("✔", "OK")),
        RolloutPhase::Failed | RolloutPhase::RolledBack => style.paint("31", style.sym("✖", "!!")),
        // Both wait for a decision from outside: a person, or the engine of a webhook hook.
        RolloutPhase::WaitingApproval | RolloutPhase::WaitingExternal => {
            style.paint("33", style.sym("⏸", "||"))
        }
        _ => style.paint("36", style.sym("◌", "..")),
    }
}

fn hook_symbol(phase: Option<HookPhase>, style: Style) -> String {
    match phase {
        Some(HookPhase::Succeeded) => style.paint("32", style.sym("✔", "+")),
        Some(HookPhase::Failed) => style.paint("31", style.sym("✖", "x")),
        Some(HookPhase::Running) | Some(HookPhase::Pending) => {
            style.paint("36", style.sym("◌", "~"))
        }
        Some(HookPhase::Waiting) => style.paint("33", style.sym("⏸", "?")),
        Some(HookPhase::Skipped) => style.sym("–", "-").to_string(),
        None => style.sym("·", ".").to_string(),
    }
}

fn hook_phase_name(p: HookPhase) -> &'static str {
    match p {
        HookPhase::Pending => "Pending",
        HookPhase::Running => "Running",
        HookPhase::Succeeded => "Succeeded",
        HookPhase::Failed => "Failed",
        HookPhase::Skipped => "Skipped",
        HookPhase::Waiting => "Waiting",
    }
}

/// The command that moves the strategy on, when it waits for a person: approve (or abort) a
/// gate, retry a failed revision. A webhook's engine decides by itself (the same annotations),
/// but a person may decide in its place.
pub fn next_commands(name: &str, ns: &str, status: &RolloutStrategyStatus) -> Vec<String> {
    let rev = status.current_revision.as_deref().unwrap_or_default();
    let tail = format!("{name} -n {ns} --revision {rev}");
    match status.phase {
        Some(RolloutPhase::WaitingApproval) => vec![
            format!("kubectl ballast approve {tail}"),
            format!("kubectl ballast abort {tail}"),
        ],
        Some(RolloutPhase::WaitingExternal) => vec![
            format!(
                "wait for the engine of webhook hook {} to approve or abort, or decide in its place:",
                status.current_hook.as_deref().unwrap_or("?")
            ),
            format!("kubectl ballast approve {tail}"),
            format!("kubectl ballast abort {tail}"),
        ],
        Some(RolloutPhase::Failed | RolloutPhase::RolledBack) => {
            vec![format!("kubectl ballast retry {tail}")]
        }
        Some(p) if crate::controller::rollout_strategy::machine::in_progress(p) => {
            vec![format!("kubectl ballast abort {tail}")]
        }
        _ => vec![],
    }
}

/// The tree of the current revision: phase, revisions and image change, replicas and progress
/// with the mid points, every hook with its point, attempt, Job, pod, state, duration, exit
/// code and log tail, what it waits for and the next command.
pub fn status_tree(s: &RolloutStrategy, extra: &Extra, now: Timestamp, style: Style) -> String {
    let st = s.status.clone().unwrap_or_default();
    let name = s.metadata.name.as_deref().unwrap_or_default();
    let ns = s.metadata.namespace.as_deref().unwrap_or("default");
    let phase = st.phase.unwrap_or_default();
    let bold = |t: &str| style.paint("1", t);
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} {}   namespace {ns}   Deployment {}",
        bold("RolloutStrategy"),
        bold(name),
        s.spec.target_ref.name
    );
    let since = st
        .phase_transition_time
        .as_ref()
        .map(|t| format!(" (for {})", human(now.duration_since(t.0))))
        .unwrap_or_default();
    let _ = writeln!(
        o,
        "  Phase:     {} {}{since}",
        phase_symbol(phase, style),
        phase_name(phase)
    );
    let _ = writeln!(
        o,
        "  Revision:  {} {} {}",
        st.stable_revision.as_deref().unwrap_or("none"),
        style.sym("→", "->"),
        st.current_revision.as_deref().unwrap_or("none")
    );
    for c in &extra.images {
        let _ = writeln!(
            o,
            "  Image:     {}: {} {} {}",
            c.container,
            c.from.as_deref().unwrap_or("(new)"),
            style.sym("→", "->"),
            c.to
        );
    }
    let desired = extra.desired.or(st.desired_replicas).unwrap_or(0);
    let updated = st.updated_replicas.unwrap_or(0);
    let _ = writeln!(
        o,
        "  Replicas:  desired {desired}, updated {updated}, ready {}, available {}",
        st.ready_replicas.unwrap_or(0),
        st.available_replicas.unwrap_or(0)
    );
    let marks: Vec<(String, i32)> = s
        .spec
        .mid
        .iter()
        .filter_map(|h| Some((h.name.clone(), progress_point(h.at.as_ref()?, desired)?)))
        .collect();
    let (bar, below) = progress_bar(
        desired,
        updated,
        extra.new_available.unwrap_or(updated),
        &marks,
        24,
        style,
    );
    let _ = writeln!(o, "  Progress:  {bar}");
    if !below.is_empty() {
        let _ = writeln!(o, "             {below}");
    }
    if let Some(m) = &st.message {
        let _ = writeln!(o, "  Message:   {m}");
    }
    let _ = writeln!(o, "  Hooks:");
    let hooks: Vec<(HookPoint, &crate::api::Hook)> = s.spec.hooks().collect();
    if hooks.is_empty() {
        let _ = writeln!(o, "    (none)");
    }
    for (i, (point, hook)) in hooks.iter().enumerate() {
        let last = i + 1 == hooks.len();
        let branch = match (style.unicode, last) {
            (true, false) => "├──",
            (true, true) => "└──",
            (false, false) => "|--",
            (false, true) => "`--",
        };
        let pipe = if last {
            "   "
        } else {
            style.sym("│  ", "|  ")
        };
        let e: Option<&HookStatus> = st.hooks.iter().find(|e| e.name == hook.name);
        let kind = if hook.approval.is_some() {
            "approval".to_string()
        } else if hook.webhook.is_some() {
            "webhook".to_string()
        } else {
            String::new()
        };
        let at = hook
            .at
            .as_ref()
            .map(|a| match a {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => {
                    format!(" at {n}")
                }
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => {
                    format!(" at {s}")
                }
            })
            .unwrap_or_default();
        let state = e.map_or("not started".to_string(), |e| {
            let mut t = hook_phase_name(e.phase).to_string();
            if let Some(r) = &e.reason {
                t.push_str(&format!(" ({r})"));
            }
            t
        });
        let _ = write!(
            o,
            "    {branch} {} {:<4} {}{at}{}  {state}",
            hook_symbol(e.map(|e| e.phase), style),
            point.as_str(),
            bold(&hook.name),
            if kind.is_empty() {
                String::new()
            } else {
                format!(" [{kind}]")
            },
        );
        if let Some(e) = e {
            if let Some(start) = &e.start_time {
                let end = e.finish_time.as_ref().map_or(now, |t| t.0);
                let _ = write!(o, "  {}", human(end.duration_since(start.0)));
            }
            if let Some(code) = e.exit_code {
                let _ = write!(o, "  exit {code}");
            }
            if let Some(code) = e.http_status {
                let _ = write!(o, "  HTTP {code}");
            }
        }
        let _ = writeln!(o);
        if let Some(e) = e {
            if let Some(job) = &e.job_name {
                let pod = extra.pods.get(job).map_or("(pod gone)", String::as_str);
                let _ = writeln!(
                    o,
                    "    {pipe}    attempt {}  job {job}  pod {pod}",
                    e.attempt
                );
            }
            if let Some(d) = &e.deadline
                && e.phase == HookPhase::Waiting
            {
                let left = d.0.duration_since(now);
                let _ = writeln!(
                    o,
                    "    {pipe}    deadline {} ({} left, then {})",
                    d.0.round(jiff::Unit::Second).unwrap_or(d.0),
                    human(left),
                    match hook.approval.as_ref().map(|g| g.on_timeout()) {
                        Some(crate::api::OnTimeout::Approve) => "approved",
                        // An engine that does not decide in time fails the hook
                        // (WebhookDecisionTimeout): its failurePolicy decides.
                        None if hook.webhook.is_some() => "failed",
                        _ => "aborted",
                    }
                );
            }
            if e.phase == HookPhase::Failed
                && let Some(m) = &e.message
            {
                let _ = writeln!(o, "    {pipe}    {}", style.paint("31", m));
            }
            if let Some(tail) = &e.log_tail {
                let _ = writeln!(o, "    {pipe}    log:");
                for l in tail
                    .lines()
                    .rev()
                    .take(5)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                {
                    let _ = writeln!(o, "    {pipe}      {l}");
                }
            }
        }
    }
    let next = next_commands(name, ns, &st);
    if !next.is_empty() {
        let _ = writeln!(o, "  Next:      {}", next.join("\n             "));
    }
    o
}

/// Where `wait` stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not decided yet; why.
    Waiting(String),
    Succeeded(String),
    /// Failed or rolled back: what failed (hook, exit code, log tail).
    Failed(String),
}

/// Which revision `wait` waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The revision of the Deployment's template of this generation (or a later one): the
    /// status must have taken it up (`status.deploymentGeneration`) before its phase counts,
    /// so the previous revision's success never passes.
    Generation(i64),
    /// A named revision: its phase counts only once `status.currentRevision` names it.
    Revision(String),
}

/// The verdict of `wait` on `status` for `target`.
pub fn verdict(status: &RolloutStrategyStatus, target: &Target) -> Verdict {
    let phase = status.phase.unwrap_or_default();
    let cur = status.current_revision.as_deref().unwrap_or("none");
    match target {
        Target::Generation(g) => {
            let seen = status.deployment_generation.unwrap_or(0);
            if seen < *g {
                return Verdict::Waiting(format!(
                    "the strategy has not taken up Deployment generation {g} yet (it describes {seen})"
                ));
            }
        }
        Target::Revision(r) => {
            if cur != r {
                return Verdict::Waiting(format!(
                    "the strategy is on revision {cur}, not {r} (yet)"
                ));
            }
        }
    }
    match phase {
        RolloutPhase::Succeeded | RolloutPhase::Idle => {
            Verdict::Succeeded(format!("revision {cur} {}", phase_name(phase)))
        }
        RolloutPhase::Failed | RolloutPhase::RolledBack => Verdict::Failed(failure(status)),
        p => Verdict::Waiting(format!("revision {cur}: {}", phase_name(p))),
    }
}

/// What failed: the phase and message, and the failed hook's exit code and log tail.
pub fn failure(status: &RolloutStrategyStatus) -> String {
    let mut o = format!(
        "revision {} {}: {}",
        status.current_revision.as_deref().unwrap_or("none"),
        phase_name(status.phase.unwrap_or_default()),
        status.message.as_deref().unwrap_or_default()
    );
    if let Some(h) = status
        .hooks
        .iter()
        .rev()
        .find(|h| h.phase == HookPhase::Failed)
    {
        let _ = write!(
            o,
            "\nfailed hook: {} ({} attempt {}), reason {}, exit code {}",
            h.name,
            h.point.as_str(),
            h.attempt,
            h.reason.as_deref().unwrap_or("unknown"),
            h.exit_code
                .map_or_else(|| "none".to_string(), |c| c.to_string())
        );
        if let Some(tail) = &h.log_tail {
            let _ = write!(o, "\nlog tail:\n{tail}");
        }
    }
    o
}

/// What `approve`, `abort` and `retry` do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Act {
    Approve,
    Abort,
    Retry,
}

impl Act {
    pub fn annotation(self) -> &'static str {
        match self {
            Act::Approve => APPROVE_ANNOTATION,
            Act::Abort => ABORT_ANNOTATION,
            Act::Retry => RETRY_ANNOTATION,
        }
    }
}

/// Whether `act` on `revision` makes sense now; `Err` is the message that refuses it.
pub fn check_act(
    act: Act,
    name: &str,
    status: &RolloutStrategyStatus,
    revision: &str,
) -> Result<(), String> {
    let phase = status.phase.unwrap_or_default();
    let cur = status.current_revision.as_deref().unwrap_or("none");
    if revision != cur {
        return Err(format!(
            "rolloutstrategy/{name} is on revision {cur} (phase {}), not {revision}: nothing to {} there",
            phase_name(phase),
            verb(act)
        ));
    }
    let ok = match act {
        // The controller takes the approve annotation of the revision in both.
        Act::Approve => matches!(
            phase,
            RolloutPhase::WaitingApproval | RolloutPhase::WaitingExternal
        ),
        Act::Abort => crate::controller::rollout_strategy::machine::in_progress(phase),
        Act::Retry => matches!(phase, RolloutPhase::Failed | RolloutPhase::RolledBack),
    };
    if ok {
        return Ok(());
    }
    let wants = match act {
        Act::Approve => "waiting for an approval or an external decision",
        Act::Abort => "under way",
        Act::Retry => "failed or rolled back",
    };
    Err(format!(
        "revision {revision} of rolloutstrategy/{name} is not {wants}: its phase is {}{}",
        phase_name(phase),
        status
            .message
            .as_deref()
            .map(|m| format!(" ({m})"))
            .unwrap_or_default()
    ))
}

fn verb(act: Act) -> &'static str {
    match act {
        Act::Approve => "approve",
        Act::Abort => "abort",
        Act::Retry => "retry",
    }
}

/// Pods of one workload per domain of one topology key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SpreadRow {
    pub workload: String,
    pub topology_key: String,
    /// Every domain among schedulable nodes, with the workload's scheduled pods in it.
    pub domains: Vec<(String, i32)>,
    /// Largest minus smallest count over the domains.
    pub skew: i32,
    pub max_skew: Option<i32>,
    /// Pods not scheduled (no node).
    pub pending: i32,
}

/// Counts `pods` (their node names; `None` = not scheduled) per value of `key` on their
/// nodes, over every domain of `nodes` (node name → labels) that schedules pods.
pub fn spread_row(
    workload: &str,
    key: &str,
    max_skew: Option<i32>,
    pods: &[Option<String>],
    nodes: &BTreeMap<String, (bool, BTreeMap<String, String>)>,
) -> SpreadRow {
    let mut domains: BTreeMap<String, i32> = nodes
        .values()
        .filter(|(schedulable, _)| *schedulable)
        .filter_map(|(_, labels)| labels.get(key).map(|v| (v.clone(), 0)))
        .collect();
    let mut pending = 0;
    for p in pods {
        match p {
            None => pending += 1,
            Some(node) => {
                if let Some(v) = nodes.get(node).and_then(|(_, l)| l.get(key)) {
                    *domains.entry(v.clone()).or_default() += 1;
                }
            }
        }
    }
    let max = domains.values().copied().max().unwrap_or(0);
    let min = domains.values().copied().min().unwrap_or(0);
    SpreadRow {
        workload: workload.to_string(),
        topology_key: key.to_string(),
        domains: domains.into_iter().collect(),
        skew: max - min,
        max_skew,
        pending,
    }
}

/// The `spread` table: per workload and topology key, the pods per domain with a small bar,
/// the skew against `maxSkew`, and the Pending pods; then the verdict.
pub fn spread_table(rows: &[SpreadRow], verdict: &str, style: Style) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<28} {:<32} {:<18} {:>5} {:>7}",
        "WORKLOAD", "TOPOLOGY KEY", "DOMAIN", "PODS", "PENDING"
    );
    for r in rows {
        let skew = match r.max_skew {
            Some(m) if r.skew > m => style.paint("31", &format!("skew {} > maxSkew {m}", r.skew)),
            Some(m) => format!("skew {} <= maxSkew {m}", r.skew),
            None => format!("skew {}", r.skew),
        };
        for (i, (domain, n)) in r.domains.iter().enumerate() {
            let bar = style.sym("■", "#").repeat((*n).clamp(0, 30) as usize);
            if i == 0 {
                let _ = writeln!(
                    o,
                    "{:<28} {:<32} {:<18} {:>5} {:>7}  {bar}",
                    r.workload, r.topology_key, domain, n, r.pending
                );
            } else {
                let _ = writeln!(
                    o,
                    "{:<28} {:<32} {:<18} {:>5} {:>7}  {bar}",
                    "", "", domain, n, ""
                );
            }
        }
        let _ = writeln!(o, "{:<28} {:<32} {skew}", "", "");
    }
    let _ = writeln!(o, "{verdict}");
    o
}

#[cfg(test)]
mod tests;
