//! What a run checks before its first step (issue 24): any world size with the default
//! evaluation, writable outputs, memory at hand, and errors that name the key or the `--set`
//! that caused them.
