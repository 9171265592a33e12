//! `kubectl ballast`: see, approve, abort, retry and wait on RolloutStrategies, and see where a
//! SpreadPolicy's pods are. Reads and watches through the user's kubeconfig, like kubectl; what
//! it prints is decided by `ballast::plugin::render`, which this binary only feeds.
#![forbid(unsafe_code)]

use anyhow::{Context as _, Result, bail};
use ballast::api::{RolloutStrategy, SpreadPolicy, WorkloadKind};
use ballast::controller::rollout_strategy::revision;
use ballast::plugin::render::{self, Act, Extra, Style, Target, Verdict};
use clap::{Args, Parser, Subcommand, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{ListParams, LogParams, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Config, ResourceExt};
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "kubectl-ballast",
    bin_name = "kubectl ballast",
    version,
    about = "See, approve, abort, retry and wait on ballast RolloutStrategies; see a SpreadPolicy's pods per domain"
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args)]
struct Global {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<std::path::PathBuf>,
    /// The kubeconfig context to use.
    #[arg(long, global = true)]
    context: Option<String>,
    /// The namespace (default: the context's).
    #[arg(short = 'n', long, global = true)]
    namespace: Option<String>,
    /// Every namespace (`status` without a name only).
    #[arg(short = 'A', long, global = true)]
    all_namespaces: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Json,
    Yaml,
}

#[derive(Subcommand)]
enum Cmd {
    /// The tree of a strategy's current revision (or, without a name, a table of strategies).
    Status {
        name: Option<String>,
        /// Redraw on every change (a watch).
        #[arg(short, long)]
        watch: bool,
        #[arg(short, long)]
        output: Option<Output>,
    },
    /// Open the approval gate the revision waits at.
    Approve(ActArgs),
    /// Fail the revision under way (`onFailure` applies: Rollback or Halt).
    Abort(ActArgs),
    /// Run a failed revision's hooks again.
    Retry(ActArgs),
    /// Wait for a revision to end: exit 0 Succeeded, 1 Failed or RolledBack, 2 timeout.
    Wait {
        name: String,
        /// Wait for this revision (as in status.currentRevision).
        #[arg(long, conflicts_with = "current")]
        revision: Option<String>,
        /// Wait for the revision status names now (default: the revision of the Deployment's
        /// template as it is now, which is what a CI job that just applied it wants).
        #[arg(long)]
        current: bool,
        /// Give up after this long (e.g. 90s, 10m, 1h).
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// A hook's pod logs, or the log tail recorded in status when the pod is gone.
    Logs {
        name: String,
        /// The hook (default: the current hook, else the last one that ran).
        hook: Option<String>,
        /// Of this revision's run (default: the current revision).
        #[arg(long)]
        revision: Option<String>,
        #[arg(short, long)]
        follow: bool,
    },
    /// Restart a Deployment (as `kubectl rollout restart`); print the revision it starts.
    Restart { deployment: String },
    /// Pods per domain of every workload a SpreadPolicy governs, at every level of its spread.
    Spread {
        name: String,
        #[arg(short, long)]
        watch: bool,
        #[arg(short, long)]
        output: Option<Output>,
    },
}

#[derive(Args)]
struct ActArgs {
    name: String,
    /// The revision (default: status.currentRevision).
    #[arg(long)]
    revision: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("not a duration: {s}"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("not a duration: {s} (use s, m or h)")),
    };
    Ok(Duration::from_secs(secs))
}

struct Ctx {
    client: Client,
    ns: String,
    all: bool,
    style: Style,
}

async fn connect(g: &Global) -> Result<Ctx> {
    let kc = match &g.kubeconfig {
        Some(p) => Kubeconfig::read_from(p)?,
        None => Kubeconfig::read().context("reading the kubeconfig")?,
    };
    let opts = KubeConfigOptions {
        context: g.context.clone(),
        ..Default::default()
    };
    let config = Config::from_custom_kubeconfig(kc, &opts).await?;
    let ns = g
        .namespace
        .clone()
        .unwrap_or_else(|| config.default_namespace.clone());
    let style = if std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none() {
        Style::TTY
    } else {
        Style::PLAIN
    };
    Ok(Ctx {
        client: Client::try_from(config)?,
        ns,
        all: g.all_namespaces,
        style,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let ctx = match connect(&cli.global).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(1);
        }
    };
    match run(cli.cmd, &ctx).await {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cmd: Cmd, ctx: &Ctx) -> Result<u8> {
    match cmd {
        Cmd::Status {
            name: None, output, ..
        } => list(ctx, output).await,
        Cmd::Status {
            name: Some(name),
            watch,
            output,
        } => status(ctx, &name, watch, output).await,
        Cmd::Approve(a) => act(ctx, Act::Approve, a).await,
        Cmd::Abort(a) => act(ctx, Act::Abort, a).await,
        Cmd::Retry(a) => act(ctx, Act::Retry, a).await,
        Cmd::Wait {
            name,
            revision,
            current,
            timeout,
        } => wait(ctx, &name, revision, current, timeout).await,
        Cmd::Logs {
            name,
            hook,
            revision,
            follow,
        } => logs(ctx, &name, hook, revision, follow).await,
        Cmd::Restart { deployment } => restart(ctx, &deployment).await,
        Cmd::Spread {
            name,
            watch,
            output,
        } => spread(ctx, &name, watch, output).await,
    }
}

fn print_data<T: serde::Serialize>(v: &T, o: Output) -> Result<()> {
    match o {
        Output::Json => println!("{}", serde_json::to_string_pretty(v)?),
        Output::Yaml => print!("{}", serde_yaml::to_string(v)?),
    }
    Ok(())
}

fn strategies(ctx: &Ctx) -> Api<RolloutStrategy> {
    Api::namespaced(ctx.client.clone(), &ctx.ns)
}

async fn list(ctx: &Ctx, output: Option<Output>) -> Result<u8> {
    let api: Api<RolloutStrategy> = if ctx.all {
        Api::all(ctx.client.clone())
    } else {
        strategies(ctx)
    };
    let items = api.list(&ListParams::default()).await?.items;
    if let Some(o) = output {
        print_data(&items, o)?;
        return Ok(0);
    }
    println!(
        "{:<16} {:<24} {:<16} {:<16} {:<12} {:<6} MESSAGE",
        "NAMESPACE", "NAME", "PHASE", "HOOK", "REVISION", "READY"
    );
    for s in items {
        let st = s.status.clone().unwrap_or_default();
        println!(
            "{:<16} {:<24} {:<16} {:<16} {:<12} {:<6} {}",
            s.namespace().unwrap_or_default(),
            s.name_any(),
            st.phase
                .map(ballast::controller::rollout_strategy::machine::phase_name)
                .unwrap_or(""),
            st.current_hook.unwrap_or_default(),
            st.current_revision.unwrap_or_default(),
            st.ready.unwrap_or_default(),
            st.message.unwrap_or_default()
        );
    }
    Ok(0)
}

/// What the tree shows besides the strategy: the image change, the new ReplicaSet's available
/// pods, the hook pods.
async fn extra(ctx: &Ctx, s: &RolloutStrategy) -> Result<Extra> {
    let st = s.status.clone().unwrap_or_default();
    let mut extra = Extra::default();
    let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    if let Some(d) = deps.get_opt(&s.spec.target_ref.name).await? {
        let spec = d.spec.clone().unwrap_or_default();
        extra.desired = spec.replicas;
        let template = serde_json::to_value(&spec.template)?;
        extra.images = render::image_changes(st.stable_template.as_ref(), &template);
        if let Some(cur) = &st.current_revision {
            let rss: Api<ReplicaSet> = Api::namespaced(ctx.client.clone(), &ctx.ns);
            let uid = d.uid().unwrap_or_default();
            let selector = spec
                .selector
                .match_labels
                .unwrap_or_default()
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",");
            for rs in rss
                .list(&ListParams::default().labels(&selector))
                .await?
                .items
            {
                let owned = rs.owner_references().iter().any(|o| o.uid == uid);
                let t = rs.spec.as_ref().and_then(|s| s.template.clone());
                if owned && t.is_some_and(|t| &revision::of_replica_set_template(&t) == cur) {
                    extra.new_available = rs.status.and_then(|s| s.available_replicas).or(Some(0));
                }
            }
        }
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let lp = ListParams::default().labels(&format!("ballast.dev/strategy={}", s.name_any()));
    for p in pods.list(&lp).await?.items {
        if let Some(job) = p.labels().get("job-name") {
            extra.pods.insert(job.clone(), p.name_any());
        }
    }
    Ok(extra)
}

fn redraw(style: Style, text: &str) {
    let mut out = std::io::stdout().lock();
    if style.color {
        // Home and clear: the tree is redrawn in place.
        let _ = write!(out, "\x1b[H\x1b[2J");
    } else {
        let _ = writeln!(out, "---");
    }
    let _ = write!(out, "{text}");
    let _ = out.flush();
}

async fn status(ctx: &Ctx, name: &str, watch: bool, output: Option<Output>) -> Result<u8> {
    let api = strategies(ctx);
    if !watch {
        let s = api
            .get_opt(name)
            .await?
            .with_context(|| format!("rolloutstrategy/{name} not found in namespace {}", ctx.ns))?;
        if let Some(o) = output {
            print_data(&s, o)?;
            return Ok(0);
        }
        let extra = extra(ctx, &s).await?;
        print!(
            "{}",
            render::status_tree(&s, &extra, jiff::Timestamp::now(), ctx.style)
        );
        return Ok(0);
    }
    // Redrawn on every change of the strategy (its status carries the replica counts and the
    // hooks), and once a second while a deadline counts down.
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, cfg).applied_objects().boxed();
    let mut last: Option<RolloutStrategy> = None;
    loop {
        let countdown = last
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some_and(|st| st.hooks.iter().any(|h| h.deadline.is_some()));
        let tick = if countdown {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(3600)
        };
        tokio::select! {
            ev = events.try_next() => match ev? {
                Some(s) => last = Some(s),
                None => return Ok(0),
            },
            _ = tokio::time::sleep(tick) => {}
            _ = tokio::signal::ctrl_c() => return Ok(0),
        }
        if let Some(s) = &last {
            if let Some(o) = output {
                print_data(s, o)?;
                continue;
            }
            let extra = extra(ctx, s).await?;
            redraw(
                ctx.style,
                &render::status_tree(s, &extra, jiff::Timestamp::now(), ctx.style),
            );
        }
    }
}

async fn act(ctx: &Ctx, act: Act, a: ActArgs) -> Result<u8> {
    let api = strategies(ctx);
    let s = api.get_opt(&a.name).await?.with_context(|| {
        format!(
            "rolloutstrategy/{} not found in namespace {}",
            a.name, ctx.ns
        )
    })?;
    let st = s.status.clone().unwrap_or_default();
    let Some(rev) = a.revision.or_else(|| st.current_revision.clone()) else {
        bail!("rolloutstrategy/{} has no current revision yet", a.name);
    };
    if let Err(why) = render::check_act(act, &a.name, &st, &rev) {
        eprintln!("refused: {why}");
        return Ok(1);
    }
    let patch = serde_json::json!({"metadata": {"annotations": {act.annotation(): rev}}});
    api.patch(&a.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let what = match act {
        Act::Approve => format!(
            "approved {} {} of revision {rev}",
            if st.phase == Some(ballast::api::RolloutPhase::WaitingExternal) {
                "webhook hook"
            } else {
                "gate"
            },
            st.current_hook.as_deref().unwrap_or("?")
        ),
        Act::Abort => format!(
            "abort of revision {rev} requested (onFailure: {:?})",
            s.spec.on_failure
        ),
        Act::Retry => format!("retry of revision {rev} requested"),
    };
    println!("rolloutstrategy/{}: {what}", a.name);
    Ok(0)
}

async fn wait(
    ctx: &Ctx,
    name: &str,
    revision: Option<String>,
    current: bool,
    timeout: Duration,
) -> Result<u8> {
    let api = strategies(ctx);
    let s = api
        .get_opt(name)
        .await?
        .with_context(|| format!("rolloutstrategy/{name} not found in namespace {}", ctx.ns))?;
    let target = if let Some(r) = revision {
        Target::Revision(r)
    } else if current {
        let st = s.status.clone().unwrap_or_default();
        Target::Revision(
            st.current_revision
                .context("no current revision in status")?,
        )
    } else {
        // The Deployment's generation now: the status counts only once it has taken that up.
        let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
        let d = deps
            .get(&s.spec.target_ref.name)
            .await
            .with_context(|| format!("reading deployment/{}", s.spec.target_ref.name))?;
        Target::Generation(d.metadata.generation.unwrap_or(0))
    };
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, cfg).applied_objects().boxed();
    let mut why = String::from("nothing observed");
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            ev = events.try_next() => {
                let Some(s) = ev? else { bail!("the watch ended") };
                match render::verdict(&s.status.unwrap_or_default(), &target) {
                    Verdict::Succeeded(m) => {
                        println!("rolloutstrategy/{name}: {m}");
                        return Ok(0);
                    }
                    Verdict::Failed(m) => {
                        println!("rolloutstrategy/{name}: {m}");
                        return Ok(1);
                    }
                    Verdict::Waiting(m) => why = m,
                }
            }
            _ = &mut deadline => {
                eprintln!("rolloutstrategy/{name}: timed out after {}s: {why}", timeout.as_secs());
                return Ok(2);
            }
        }
    }
}

async fn logs(
    ctx: &Ctx,
    name: &str,
    hook: Option<String>,
    revision: Option<String>,
    follow: bool,
) -> Result<u8> {
    let s = strategies(ctx)
        .get_opt(name)
        .await?
        .with_context(|| format!("rolloutstrategy/{name} not found in namespace {}", ctx.ns))?;
    let st = s.status.clone().unwrap_or_default();
    let rev = revision.or(st.current_revision.clone()).unwrap_or_default();
    let hook = hook
        .or(st.current_hook.clone())
        .or_else(|| {
            st.hooks
                .iter()
                .filter(|h| h.job_name.is_some())
                .max_by_key(|h| h.start_time.as_ref().map(|t| t.0))
                .map(|h| h.name.clone())
        })
        .context("no hook has run yet; name one")?;
    let entry = st
        .hooks
        .iter()
        .find(|h| h.name == hook && h.revision == rev);
    // The newest pod of that hook and revision (status keeps the latest attempt only).
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let lp = ListParams::default().labels(&format!(
        "ballast.dev/strategy={name},ballast.dev/hook={hook},ballast.dev/revision={rev}"
    ));
    let mut found = pods.list(&lp).await?.items;
    found.sort_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0));
    if let Some(pod) = found.last() {
        let lp = LogParams {
            follow,
            ..Default::default()
        };
        eprintln!("# pod {} (hook {hook}, revision {rev})", pod.name_any());
        if follow {
            match pods.log_stream(&pod.name_any(), &lp).await {
                Ok(stream) => {
                    let mut lines = futures::AsyncBufReadExt::lines(stream);
                    while let Some(l) = lines.next().await {
                        println!("{}", l?);
                    }
                    return Ok(0);
                }
                Err(e) => eprintln!("# its log cannot be read ({e})"),
            }
        } else {
            match pods.logs(&pod.name_any(), &lp).await {
                Ok(text) => {
                    print!("{text}");
                    return Ok(0);
                }
                Err(e) => eprintln!("# its log cannot be read ({e})"),
            }
        }
    } else {
        eprintln!("# no pod of hook {hook} (revision {rev}) is left");
    }
    match entry.and_then(|e| e.log_tail.clone()) {
        Some(tail) => {
            eprintln!("# the log tail recorded in status:");
            println!("{tail}");
            Ok(0)
        }
        None => {
            eprintln!("# status recorded no log tail for hook {hook} of revision {rev}");
            Ok(1)
        }
    }
}

async fn restart(ctx: &Ctx, name: &str) -> Result<u8> {
    let deps: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)?
        .to_string();
    // What `kubectl rollout restart` writes; the revision gate pauses it when it is governed.
    let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
        "kubectl.kubernetes.io/restartedAt": now}}}}});
    let d = deps
        .patch(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("restarting deployment/{name}"))?;
    let rev = revision::of_template(&d.spec.unwrap_or_default().template);
    let governed = d
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("ballast.dev/rollout-strategy").cloned())
        .or_else(|| {
            d.metadata
                .labels
                .as_ref()
                .filter(|l| l.contains_key("ballast.dev/governed"))
                .map(|_| "(a strategy)".into())
        });
    match governed {
        Some(s) => println!(
            "deployment/{name} restarted: revision {rev}, its hooks run under rolloutstrategy/{s} (kubectl ballast wait {s} -n {})",
            ctx.ns
        ),
        None => println!("deployment/{name} restarted: revision {rev}"),
    }
    Ok(0)
}

fn selector_string(s: &LabelSelector) -> String {
    let mut parts: Vec<String> = s
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    for e in s.match_expressions.iter().flatten() {
        let values = e.values.clone().unwrap_or_default().join(",");
        parts.push(match e.operator.as_str() {
            "In" => format!("{} in ({values})", e.key),
            "NotIn" => format!("{} notin ({values})", e.key),
            "Exists" => e.key.clone(),
            _ => format!("!{}", e.key),
        });
    }
    parts.join(",")
}

/// The rows of `spread`, read afresh: workloads of the policy, their pods, the nodes.
async fn spread_rows(ctx: &Ctx, p: &SpreadPolicy) -> Result<(Vec<render::SpreadRow>, String)> {
    let c = &ctx.client;
    let sel = ListParams::default().labels(&selector_string(&p.spec.selector));
    let mut workloads: Vec<(String, LabelSelector)> = vec![];
    let kinds = if p.spec.kinds.is_empty() {
        vec![WorkloadKind::Deployment, WorkloadKind::StatefulSet]
    } else {
        p.spec.kinds.clone()
    };
    for kind in kinds {
        match kind {
            WorkloadKind::Deployment => {
                for d in Api::<Deployment>::namespaced(c.clone(), &ctx.ns)
                    .list(&sel)
                    .await?
                    .items
                {
                    workloads.push((
                        format!("Deployment/{}", d.name_any()),
                        d.spec.unwrap_or_default().selector,
                    ));
                }
            }
            WorkloadKind::StatefulSet => {
                for d in Api::<StatefulSet>::namespaced(c.clone(), &ctx.ns)
                    .list(&sel)
                    .await?
                    .items
                {
                    workloads.push((
                        format!("StatefulSet/{}", d.name_any()),
                        d.spec.unwrap_or_default().selector,
                    ));
                }
            }
        }
    }
    let nodes: BTreeMap<String, (bool, BTreeMap<String, String>)> = Api::<Node>::all(c.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|n| {
            let sched = !n
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false);
            (n.name_any(), (sched, n.metadata.labels.unwrap_or_default()))
        })
        .collect();
    let pods_api: Api<Pod> = Api::namespaced(c.clone(), &ctx.ns);
    let mut rows = vec![];
    for (w, selector) in workloads {
        let pods: Vec<Option<String>> = pods_api
            .list(&ListParams::default().labels(&selector_string(&selector)))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| {
                !matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Succeeded" | "Failed")
                )
            })
            .map(|p| p.spec.and_then(|s| s.node_name))
            .collect();
        for term in &p.spec.spread {
            rows.push(render::spread_row(
                &w,
                &term.topology_key,
                term.max_skew,
                &pods,
                &nodes,
            ));
        }
    }
    let st = p.status.clone().unwrap_or_default();
    let cond = |t: &str| st.conditions.iter().find(|c| c.type_ == t);
    let verdict = match cond("Infeasible") {
        Some(c) if c.status == "True" => format!("Infeasible: {}", c.message),
        Some(_) => "Feasible: every Required spread has enough domains".to_string(),
        None => "Feasibility: not reported yet".to_string(),
    };
    Ok((rows, verdict))
}

async fn spread(ctx: &Ctx, name: &str, watch: bool, output: Option<Output>) -> Result<u8> {
    let api: Api<SpreadPolicy> = Api::namespaced(ctx.client.clone(), &ctx.ns);
    let draw = |rows: &[render::SpreadRow], verdict: &str| -> Result<()> {
        match output {
            Some(o) => print_data(&serde_json::json!({"rows": rows, "verdict": verdict}), o),
            None => {
                let text = render::spread_table(rows, verdict, ctx.style);
                if watch {
                    redraw(ctx.style, &text);
                } else {
                    print!("{text}");
                }
                Ok(())
            }
        }
    };
    if !watch {
        let p = api
            .get_opt(name)
            .await?
            .with_context(|| format!("spreadpolicy/{name} not found in namespace {}", ctx.ns))?;
        let (rows, verdict) = spread_rows(ctx, &p).await?;
        draw(&rows, &verdict)?;
        return Ok(0);
    }
    // Redrawn when the policy or a pod of the namespace changes.
    let policy = watcher(
        api.clone(),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .applied_objects()
    .map_ok(|_| ())
    .boxed();
    let pods = watcher(
        Api::<Pod>::namespaced(ctx.client.clone(), &ctx.ns),
        watcher::Config::default(),
    )
    .touched_objects()
    .map_ok(|_| ())
    .boxed();
    let mut events = futures::stream::select(policy, pods);
    while let Some(ev) = tokio::select! {
        ev = events.next() => ev,
        _ = tokio::signal::ctrl_c() => None,
    } {
        ev?;
        // Several events come at once; draw once they settle a moment.
        while let Ok(Some(more)) =
            tokio::time::timeout(Duration::from_millis(200), events.next()).await
        {
            more?;
        }
        let Some(p) = api.get_opt(name).await? else {
            bail!("spreadpolicy/{name} was deleted");
        };
        let (rows, verdict) = spread_rows(ctx, &p).await?;
        draw(&rows, &verdict)?;
    }
    Ok(0)
}
