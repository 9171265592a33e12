//! `crdgen [DIR]`: writes the CRD manifests of `ballast::api` and a `kustomization.yaml` listing
//! them into DIR (default `crds`). `make generate` runs it; `tests/crd_drift.rs` checks the result.

#![forbid(unsafe_code)]

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let dir = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "crds".to_owned()));
    std::fs::create_dir_all(&dir)?;
    for (name, text) in ballast::api::generated_files() {
        let path = dir.join(name);
        std::fs::write(&path, text)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
