//! The plugin's rendering, from hand-built strategies.

use super::*;
use serde_json::json;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn strategy(status: serde_json::Value) -> RolloutStrategy {
    serde_json::from_value(json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "RolloutStrategy",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "targetRef": {"name": "web"},
            "pre": [{"name": "migrate", "container": {"from": "app"}}],
            "mid": [{"name": "go-live", "at": "50%", "approval": {"timeoutSeconds": 600}}],
            "post": [{"name": "purge", "container": {"from": "app"}}]
        },
        "status": status
    }))
    .unwrap()
}

#[test]
fn the_bar_fills_available_then_updated_and_marks_mid_points() {
    let (bar, marks) = progress_bar(4, 2, 1, &[("smoke".into(), 2)], 8, Style::PLAIN);
    assert_eq!(bar, "[##++....] 2/4 updated, 1 available");
    assert_eq!(marks, "    ^  smoke@2");
    let (bar, marks) = progress_bar(0, 0, 0, &[], 4, Style::PLAIN);
    assert_eq!(bar, "[....] 0/0 updated, 0 available");
    assert_eq!(marks, "");
    let (bar, _) = progress_bar(3, 3, 3, &[], 6, Style::TTY);
    assert!(bar.contains("██████") && bar.contains("\x1b[32m"), "{bar}");
}

#[test]
fn image_changes_name_the_container_and_both_images() {
    let stable = json!({"spec": {"containers": [{"name": "app", "image": "web:1"}, {"name": "side", "image": "s:1"}]}});
    let now = json!({"spec": {"containers": [{"name": "app", "image": "web:2"}, {"name": "side", "image": "s:1"}]}});
    assert_eq!(
        image_changes(Some(&stable), &now),
        [ImageChange {
            container: "app".into(),
            from: Some("web:1".into()),
            to: "web:2".into()
        }]
    );
    assert!(image_changes(Some(&now), &now).is_empty());
}

#[test]
fn the_tree_shows_every_hook_the_deadline_and_the_next_command() {
    let s = strategy(json!({
        "phase": "WaitingApproval", "phaseTransitionTime": "2027-01-15T08:00:00Z",
        "stableRevision": "aaaaaaaaaa", "currentRevision": "bbbbbbbbbb", "currentHook": "go-live",
        "updatedReplicas": 2, "readyReplicas": 4, "availableReplicas": 4, "desiredReplicas": 4,
        "message": "waiting for approval",
        "hooks": [
            {"name": "migrate", "point": "Pre", "revision": "bbbbbbbbbb", "attempt": 1,
             "jobName": "web-migrate-bbbbbbbbbb-1", "phase": "Succeeded", "exitCode": 0,
             "startTime": "2027-01-15T07:59:00Z", "finishTime": "2027-01-15T07:59:04Z"},
            {"name": "go-live", "point": "Mid", "revision": "bbbbbbbbbb", "attempt": 1,
             "phase": "Waiting", "startTime": "2027-01-15T08:00:00Z",
             "deadline": "2027-01-15T08:10:00Z"}
        ]
    }));
    let extra = Extra {
        images: vec![ImageChange {
            container: "app".into(),
            from: Some("web:1".into()),
            to: "web:2".into(),
        }],
        desired: Some(4),
        new_available: Some(2),
        pods: [(
            "web-migrate-bbbbbbbbbb-1".to_string(),
            "web-migrate-bbbbbbbbbb-1-x7k".to_string(),
        )]
        .into(),
    };
    let now: Timestamp = "2027-01-15T08:04:00Z".parse().unwrap();
    let out = status_tree(&s, &extra, now, Style::PLAIN);
    for want in [
        "RolloutStrategy web   namespace shop   Deployment web",
        "Phase:     || WaitingApproval (for 4m00s)",
        "Revision:  aaaaaaaaaa -> bbbbbbbbbb",
        "Image:     app: web:1 -> web:2",
        "Replicas:  desired 4, updated 2, ready 4, available 4",
        "[############............] 2/4 updated, 2 available",
        "go-live@2",
        "|-- + pre  migrate  Succeeded  4s  exit 0",
        "attempt 1  job web-migrate-bbbbbbbbbb-1  pod web-migrate-bbbbbbbbbb-1-x7k",
        "|-- ? mid  go-live at 50% [approval]  Waiting  4m00s",
        "deadline 2027-01-15T08:10:00Z (6m00s left, then aborted)",
        "`-- . post purge  not started",
        "Next:      kubectl ballast approve web -n shop --revision bbbbbbbbbb",
        "kubectl ballast abort web -n shop --revision bbbbbbbbbb",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    assert!(!out.contains('\x1b'), "no colour off a terminal");
}

/// A pre webhook hook whose engine answered 202 Accepted: the strategy waits in
/// `WaitingExternal`, paused before the new revision's first pod.
fn waiting_external() -> RolloutStrategy {
    serde_json::from_value(json!({
        "apiVersion": "ballast.dev/v1alpha1", "kind": "RolloutStrategy",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {
            "targetRef": {"name": "web"},
            "pre": [{"name": "change-ticket", "timeoutSeconds": 3600,
                     "webhook": {"service": {"name": "change-bot", "port": 8443}}}]
        },
        "status": {
            "phase": "WaitingExternal", "phaseTransitionTime": "2027-01-15T08:00:00Z",
            "stableRevision": "aaaaaaaaaa", "currentRevision": "bbbbbbbbbb",
            "currentHook": "change-ticket",
            "hooks": [{"name": "change-ticket", "point": "Pre", "revision": "bbbbbbbbbb",
                       "attempt": 1, "phase": "Waiting", "httpStatus": 202,
                       "startTime": "2027-01-15T08:00:00Z", "deadline": "2027-01-15T09:00:00Z"}]
        }
    }))
    .unwrap()
}

#[test]
fn a_webhook_waiting_for_its_engine_shows_paused_with_the_deadline_and_who_decides() {
    let now: Timestamp = "2027-01-15T08:10:00Z".parse().unwrap();
    let out = status_tree(&waiting_external(), &Extra::default(), now, Style::PLAIN);
    for want in [
        "Phase:     || WaitingExternal (for 10m00s)",
        "`-- ? pre  change-ticket [webhook]  Waiting  10m00s  HTTP 202",
        // The engine that never answers fails the hook; it is not an approval gate's onTimeout.
        "deadline 2027-01-15T09:00:00Z (50m00s left, then failed)",
        "Next:      wait for the engine of webhook hook change-ticket to approve or abort, or decide in its place:",
        "kubectl ballast approve web -n shop --revision bbbbbbbbbb",
        "kubectl ballast abort web -n shop --revision bbbbbbbbbb",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let tty = status_tree(&waiting_external(), &Extra::default(), now, Style::TTY);
    assert!(
        tty.contains("\x1b[33m⏸\x1b[0m WaitingExternal"),
        "coloured as WaitingApproval: {tty}"
    );
}

#[test]
fn approve_and_abort_accept_a_revision_waiting_for_its_engine_and_wait_goes_on() {
    let s = waiting_external();
    let st = s.status.as_ref().unwrap();
    assert!(check_act(Act::Approve, "web", st, "bbbbbbbbbb").is_ok());
    assert!(check_act(Act::Abort, "web", st, "bbbbbbbbbb").is_ok());
    let e = check_act(Act::Retry, "web", st, "bbbbbbbbbb").unwrap_err();
    assert!(e.contains("its phase is WaitingExternal"), "{e}");
    let e = check_act(Act::Approve, "web", st, "aaaaaaaaaa").unwrap_err();
    assert!(e.contains("is on revision bbbbbbbbbb"), "{e}");
    // Not terminal: `wait` keeps waiting, for a generation or for the revision.
    let mut st = st.clone();
    st.deployment_generation = Some(8);
    assert_eq!(
        verdict(&st, &Target::Revision("bbbbbbbbbb".into())),
        Verdict::Waiting("revision bbbbbbbbbb: WaitingExternal".into())
    );
    assert!(matches!(
        verdict(&st, &Target::Generation(8)),
        Verdict::Waiting(_)
    ));
}

#[test]
fn a_failed_hook_shows_its_exit_code_message_and_log_tail() {
    let s = strategy(json!({
        "phase": "RolledBack", "stableRevision": "aaaaaaaaaa", "currentRevision": "bbbbbbbbbb",
        "hooks": [{"name": "migrate", "point": "Pre", "revision": "bbbbbbbbbb", "attempt": 2,
             "jobName": "web-migrate-bbbbbbbbbb-2", "phase": "Failed", "exitCode": 3,
             "reason": "Error", "message": "migration 42 failed", "logTail": "a\nb\nboom"}]
    }));
    let out = status_tree(&s, &Extra::default(), t(0), Style::PLAIN);
    for want in [
        "x pre  migrate  Failed (Error)",
        "exit 3",
        "pod (pod gone)",
        "migration 42 failed",
        "      boom",
        "kubectl ballast retry web -n shop --revision bbbbbbbbbb",
    ] {
        assert!(out.contains(want), "missing {want:?} in\n{out}");
    }
    let f = failure(s.status.as_ref().unwrap());
    assert!(
        f.contains("failed hook: migrate (pre attempt 2), reason Error, exit code 3"),
        "{f}"
    );
    assert!(f.ends_with("log tail:\na\nb\nboom"), "{f}");
}

fn st(v: serde_json::Value) -> RolloutStrategyStatus {
    serde_json::from_value(v).unwrap()
}

#[test]
fn wait_never_passes_on_the_previous_revisions_success() {
    // Right after a template change (generation 7), the status still shows the previous
    // revision's success, for generation 5.
    let before = st(
        json!({"phase": "Succeeded", "currentRevision": "aaaaaaaaaa", "deploymentGeneration": 5}),
    );
    assert!(matches!(
        verdict(&before, &Target::Generation(7)),
        Verdict::Waiting(_)
    ));
    assert!(matches!(
        verdict(&before, &Target::Revision("bbbbbbbbbb".into())),
        Verdict::Waiting(_)
    ));
    let running =
        st(json!({"phase": "PreHook", "currentRevision": "bbbbbbbbbb", "deploymentGeneration": 8}));
    assert!(matches!(
        verdict(&running, &Target::Generation(7)),
        Verdict::Waiting(_)
    ));
    let done = st(
        json!({"phase": "Succeeded", "currentRevision": "bbbbbbbbbb", "deploymentGeneration": 9}),
    );
    assert!(matches!(
        verdict(&done, &Target::Generation(7)),
        Verdict::Succeeded(_)
    ));
    assert!(matches!(
        verdict(&done, &Target::Revision("bbbbbbbbbb".into())),
        Verdict::Succeeded(_)
    ));
    let failed = st(
        json!({"phase": "RolledBack", "currentRevision": "bbbbbbbbbb", "deploymentGeneration": 9}),
    );
    assert!(matches!(
        verdict(&failed, &Target::Generation(7)),
        Verdict::Failed(_)
    ));
}

#[test]
fn acts_are_refused_unless_the_revision_waits_for_them() {
    let waiting = st(json!({"phase": "WaitingApproval", "currentRevision": "bbbbbbbbbb"}));
    assert!(check_act(Act::Approve, "web", &waiting, "bbbbbbbbbb").is_ok());
    assert!(check_act(Act::Abort, "web", &waiting, "bbbbbbbbbb").is_ok());
    let e = check_act(Act::Approve, "web", &waiting, "aaaaaaaaaa").unwrap_err();
    assert!(e.contains("is on revision bbbbbbbbbb"), "{e}");
    let e = check_act(Act::Retry, "web", &waiting, "bbbbbbbbbb").unwrap_err();
    assert!(
        e.contains("is not failed or rolled back: its phase is WaitingApproval"),
        "{e}"
    );
    let done = st(json!({"phase": "Succeeded", "currentRevision": "bbbbbbbbbb"}));
    let e = check_act(Act::Abort, "web", &done, "bbbbbbbbbb").unwrap_err();
    assert!(e.contains("is not under way"), "{e}");
    let rolling = st(json!({"phase": "Rolling", "currentRevision": "bbbbbbbbbb"}));
    let e = check_act(Act::Approve, "web", &rolling, "bbbbbbbbbb").unwrap_err();
    assert!(e.contains("not waiting for an approval"), "{e}");
}

#[test]
fn spread_counts_pods_per_domain_including_empty_ones_and_pending() {
    let node = |zone: &str, sched: bool| {
        (
            sched,
            BTreeMap::from([("zone".to_string(), zone.to_string())]),
        )
    };
    let nodes = BTreeMap::from([
        ("n1".to_string(), node("a", true)),
        ("n2".to_string(), node("a", true)),
        ("n3".to_string(), node("b", true)),
        ("n4".to_string(), node("c", true)),
        ("n5".to_string(), node("d", false)),
    ]);
    let pods = [
        Some("n1".to_string()),
        Some("n2".to_string()),
        Some("n3".to_string()),
        None,
    ];
    let r = spread_row("Deployment/web", "zone", Some(1), &pods, &nodes);
    assert_eq!(
        r.domains,
        [("a".into(), 2), ("b".into(), 1), ("c".into(), 0)]
    );
    assert_eq!((r.skew, r.pending), (2, 1));
    let table = spread_table(&[r], "Infeasible: False", Style::PLAIN);
    assert!(table.contains("Deployment/web"), "{table}");
    assert!(table.contains("skew 2 > maxSkew 1"), "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.contains(" a ") && l.ends_with("  ##")),
        "{table}"
    );
}

#[test]
fn human_durations() {
    assert_eq!(human(SignedDuration::from_secs(5)), "5s");
    assert_eq!(human(SignedDuration::from_secs(125)), "2m05s");
    assert_eq!(human(SignedDuration::from_secs(3720)), "1h02m");
    assert_eq!(human(SignedDuration::from_secs(-3)), "0s");
}
