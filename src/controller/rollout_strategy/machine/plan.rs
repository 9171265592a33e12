//! Several steps of the machine in one decision, where that is safe: what one reconcile
//! performs. [`decide`] takes one step and returns; a step that only moves status along (a hook
//! recorded as succeeded, a hook point with nothing left to run, a phase entered) would then
//! cost a status write and a wake-up of its own before the next one. [`plan`] carries the
//! status of each step into the next, in memory, and stops:
//! - when a step changes nothing (the plan is complete);
//! - after the first step, when that one writes something besides status: its writes rest on
//!   the status read, which is recorded already;
//! - before any write that a later step asks for (a pause or an unpause, a Job created or
//!   deleted, a scale, a template restored): every write relies on the status before it being
//!   recorded (an attempt number before its Job exists, the replicas set aside before the scale
//!   to 0, the phase before the Deployment is let go), so the plan ends with the status so far
//!   and says so ([`Plan::more`]); once that status is written, the next plan starts with that
//!   write.
//!
//! The status of a plan is what the steps one after the other would have recorded last, and
//! its Events are all of theirs: the story is the same, told with fewer writes. A plan that stops
//! before a pause or an unpause leaves the Deployment's labels to that write, which carries them
//! for the phase it ends in (one write of the Deployment instead of two).

use super::{Decision, Effect, Input, decide};

/// Steps at most in one plan (a revision goes through fewer; this only bounds a bug).
const MAX_STEPS: usize = 8;

/// A decision, and whether it ended before a write of a later step.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    pub decision: Decision,
    /// The plan stopped before a write that needs its status recorded first: plan again once
    /// that status is written.
    pub more: bool,
}

/// Whether an effect is one of the labels a decision's last step keeps true (the Deployment's
/// phase label, the strategy's mark), which each step recomputes.
fn bookkeeping(e: &Effect) -> bool {
    matches!(e, Effect::Annotate(_) | Effect::MarkTarget(_))
}

/// Plans the next writes and the status for `i`: [`decide`], step after step (module docs).
pub fn plan(i: &Input) -> Plan {
    let mut status = i.status.clone();
    let mut events = Vec::new();
    let mut hook_results = Vec::new();
    // The last step taken, whose status is `status` and whose only writes are bookkeeping.
    let mut previous: Option<Decision> = None;
    for n in 0..MAX_STEPS {
        let input = Input {
            status: &status,
            ..*i
        };
        let mut d = decide(&input);
        let writes: Vec<&Effect> = d.effects.iter().filter(|e| !bookkeeping(e)).collect();
        if let Some(mut previous) = previous.take()
            && !writes.is_empty()
        {
            // The status so far is the plan; this step's write comes once it is recorded. A
            // pause or an unpause then carries the labels (and the mark follows it).
            if writes.iter().any(|e| e.holds_or_lets_go()) {
                previous.effects.clear();
            }
            return Plan {
                decision: Decision {
                    events,
                    hook_results,
                    prune: Vec::new(),
                    ..previous
                },
                more: true,
            };
        }
        let changes = !writes.is_empty() || d.status != status;
        events.append(&mut d.events);
        hook_results.append(&mut d.hook_results);
        if !changes || !writes.is_empty() || n + 1 == MAX_STEPS {
            if n > 0 {
                // Pruning is offered only when nothing else is to be done.
                d.prune.clear();
            }
            d.events = events;
            d.hook_results = hook_results;
            return Plan {
                decision: d,
                more: false,
            };
        }
        status = d.status.clone();
        previous = Some(d);
    }
    unreachable!("the last step returns")
}
