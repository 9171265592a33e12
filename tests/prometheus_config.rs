//! `config/prometheus`: every metric its alerts and its Grafana dashboard query is one the
//! manager exports (names from `Metrics::render`), and every alert has a summary; and the alert
//! rules pass the real `promtool` (built from its Go module by hack/build-tool.sh): `check
//! rules`, and `test rules` with the unit tests in tests/fixtures/prometheus (each alert fires
//! when it should, with its labels and rendered annotations, and not before or after). No
//! cluster: the files are read as they are shipped.

mod support;

use ballast::metrics::Metrics;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The metric families the manager exports (`# TYPE <name> ...`), each given one series (a
/// family without any is not rendered).
fn exported() -> BTreeSet<String> {
    use ballast::metrics::{HookLabels, PhaseLabels, api::ApiRequestLabels};
    let m = Metrics::default();
    m.count_reconcile("rollout-strategy", 0.1);
    m.count_error("rollout-strategy", "Read");
    m.count_write("spread-policy", "Deployment", "patched");
    let hook = HookLabels {
        point: "pre",
        result: "failed",
    };
    m.hook_runs.get_or_create(&hook).inc();
    m.hook_duration.get_or_create(&hook).observe(1.0);
    m.rollout_phases
        .get_or_create(&PhaseLabels { phase: "Failed" })
        .inc();
    m.api_requests
        .get_or_create(&ApiRequestLabels {
            verb: "get",
            group: String::new(),
            resource: "pods".into(),
            code: "200".into(),
        })
        .inc();
    m.api_request_durations
        .get_or_create(&ballast::metrics::api::ApiDurationLabels {
            verb: "get",
            group: String::new(),
            resource: "pods".into(),
        })
        .observe(0.01);
    m.set_gate(true);
    m.set_rollout_phase("shop", "web", Some("Failed"));
    m.set_spread_infeasible("shop", "web-ha", Some(1));
    m.render()
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// The `ballast_*` series an expression reads, as family names.
fn families(expr: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = expr;
    while let Some(i) = rest.find("ballast_") {
        let name: String = rest[i..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[i + name.len()..];
        let family = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .unwrap_or(&name)
            .to_string();
        out.push(family);
    }
    out
}

#[test]
fn alerts_and_dashboard_query_only_metrics_the_manager_exports() {
    let have = exported();
    assert!(have.contains("ballast_rollout_strategy_phase"), "{have:?}");
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("config/prometheus/prometheusrule.yaml")).unwrap(),
    )
    .unwrap();
    let mut alerts = vec![];
    for group in rules["spec"]["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap().to_string();
            let expr = rule["expr"].as_str().unwrap();
            let used = families(expr);
            assert!(!used.is_empty(), "{name}: {expr}");
            for f in used {
                assert!(have.contains(&f), "{name} reads {f}, which is not exported");
            }
            assert!(rule["annotations"]["summary"].as_str().is_some(), "{name}");
            alerts.push(name);
        }
    }
    assert_eq!(
        alerts,
        [
            "BallastHookFailed",
            "BallastRolloutFailed",
            "BallastRevisionStuck",
            "BallastSpreadPolicyInfeasible"
        ]
    );
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("config/prometheus/dashboard.json")).unwrap(),
    )
    .unwrap();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 6);
    for p in panels {
        for t in p["targets"].as_array().unwrap() {
            for f in families(t["expr"].as_str().unwrap()) {
                assert!(have.contains(&f), "panel {} reads {f}", p["title"]);
            }
        }
    }
}

/// The stuck-revision alert matches exactly the phases in which a revision is under way (the
/// machine's `in_progress`), so a new waiting phase cannot go unwatched.
#[test]
fn the_stuck_alert_watches_every_phase_under_way() {
    use ballast::api::RolloutPhase;
    use ballast::controller::rollout_strategy::machine::in_progress;
    let rules: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("config/prometheus/prometheusrule.yaml")).unwrap(),
    )
    .unwrap();
    let expr = rules["spec"]["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap())
        .find(|r| r["alert"] == "BallastRevisionStuck")
        .expect("the BallastRevisionStuck alert")["expr"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, rest) = expr
        .split_once("phase=~\"")
        .unwrap_or_else(|| panic!("no phase=~ matcher in {expr}"));
    let watched: BTreeSet<&str> = rest.split('"').next().unwrap().split('|').collect();
    let under_way: BTreeSet<&str> = ballast::metrics::ROLLOUT_PHASES
        .into_iter()
        .filter(|p| {
            let phase: RolloutPhase = serde_json::from_value(serde_json::json!(p)).unwrap();
            in_progress(phase)
        })
        .collect();
    assert_eq!(watched, under_way, "{expr}");
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let promtool = support::go_tool("promtool");
    let rule: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("config/prometheus/prometheusrule.yaml")).unwrap(),
    )
    .unwrap();
    // A PrometheusRule's spec is a Prometheus rule file.
    let dir = root().join("target/promtool");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("rules.yaml"),
        serde_yaml::to_string(&rule["spec"]).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        root().join("tests/fixtures/prometheus/alerts_test.yaml"),
        dir.join("alerts_test.yaml"),
    )
    .unwrap();
    for args in [
        ["check", "rules", "rules.yaml"],
        ["test", "rules", "alerts_test.yaml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
