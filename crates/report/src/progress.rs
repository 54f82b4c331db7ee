//! The run's progress on stderr, as rank 0 shows it.

use std::io::IsTerminal;

use crate::metrics::StepLine;

/// Progress on stderr: a bar on a terminal, plain lines otherwise (slurm logs, CI).
pub struct Reporter {
    bar: Option<indicatif::ProgressBar>,
}

impl Reporter {
    pub fn new(enabled: Option<bool>, steps: u64, start: u64) -> Self {
        let enabled = enabled.unwrap_or_else(|| std::io::stderr().is_terminal());
        let bar = enabled.then(|| {
            let bar = indicatif::ProgressBar::new(steps).with_position(start);
            let style = indicatif::ProgressStyle::with_template(
                "{bar:30.cyan/blue} step {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
            bar.set_style(style);
            // The steps before `start` were done by an earlier launch: record them as the
            // estimator's starting point, then forget their (instant) rate, so that the time
            // left is estimated from this launch's steps alone.
            bar.tick();
            bar.reset_eta();
            bar
        });
        Reporter { bar }
    }

    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn step(&self, line: &StepLine, steps: u64) {
        match &self.bar {
            Some(bar) => {
                bar.set_position(line.step);
                bar.set_message(format!(
                    "loss {:.4} | {:.0} tok/s",
                    line.loss, line.tokens_per_s
                ));
            }
            None => eprintln!(
                "step {}/{steps} | loss {:.4} | lr {:.3e} | grad_norm {:.3} | {:.0} tok/s",
                line.step, line.loss, line.lr, line.grad_norm, line.tokens_per_s
            ),
        }
    }

    /// The run ended at its last step: the bar shows it full.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }

    /// The run stopped before its last step: the bar stays where it is.
    pub fn stop(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}
