//! `kubectl ballast`, the kubectl plugin (binary `kubectl-ballast`): what it prints, decided in
//! [`render`] (pure: the status tree, the progress bar, the `wait` verdict, the refusal of an
//! approve/abort/retry that does not apply, the `spread` table). The binary only reads, watches
//! and annotates, and hands what it read to these functions.

pub mod render;
