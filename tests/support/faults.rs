//! The fault-injection suite's record: each scenario writes one row (id, runs, passed, what was
//! checked) under `target/fault-results/`, and `hack/fault-table.sh` prints them as the table
//! that `docs/reliability.md` quotes. A scenario that fails still writes its row before it
//! panics, so the table shows the failure too.

use std::path::PathBuf;

fn results_dir() -> PathBuf {
    super::repo_root().join("target/fault-results")
}

/// One row of the fault table.
pub struct Row<'a> {
    pub id: &'a str,
    pub fault: &'a str,
    pub runs: u32,
    pub passed: u32,
    pub checked: &'a str,
}

/// Writes `row` as `target/fault-results/<id>.tsv`.
pub fn record(row: &Row) {
    let dir = results_dir();
    std::fs::create_dir_all(&dir).expect("creating target/fault-results");
    let clean = |s: &str| s.replace(['\t', '\n'], " ");
    let line = format!(
        "{}\t{}\t{}\t{}\t{}\n",
        clean(row.id),
        clean(row.fault),
        row.runs,
        row.passed,
        clean(row.checked)
    );
    std::fs::write(dir.join(format!("{}.tsv", row.id)), line).expect("writing a fault result");
    eprintln!(
        "fault {}: {}/{} runs passed — {}",
        row.id, row.passed, row.runs, row.checked
    );
}
