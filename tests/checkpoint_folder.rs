//! The checkpoint folder as a run owns it (issue 24): one run per `checkpoint.dir`, a manifest
//! checked against its folder and its rank files, retention that counts complete checkpoints
//! only, and a diverging run that keeps its last good checkpoint.
