//! `stallscope top`: a recording cut every second, each second's report through the same
//! pipeline as `report`, shown live (screen.rs) or, without a terminal, as one line a second.
mod screen;
mod stderr_log;

use std::{
    io::IsTerminal as _,
    path::PathBuf,
    sync::{Arc, Mutex, mpsc},
};

use profiler_core::{live::Live, report::json::ReportDoc};

use crate::{
    output,
    plan::TopPlan,
    recorder::{self, Segments},
};

/// What reaches the display.
pub enum Update {
    /// One more second's report.
    Second(Box<ReportDoc>),
    /// A second that could not be analysed, with why.
    Failed(String),
}

/// Records on this thread (the capabilities are dropped here after attach); the display and
/// the analysis of each second start on threads of their own once the probes are attached.
pub fn run(plan: &TopPlan) -> anyhow::Result<i32> {
    // Private to the user, made new: the held messages, and the seconds unless kept.
    let dir = crate::owner::create_private_dir("stallscope-top")?;
    let recording = match &plan.keep {
        Some(file) => file.clone(),
        None => dir.join("top.rec"),
    };
    let terminal = std::io::stdout().is_terminal();
    let log_file = dir.join("messages");
    let stop = Arc::new(tokio::sync::Notify::new());
    let (files_to, files) = mpsc::channel::<PathBuf>();
    let (updates_to, updates) = mpsc::channel::<Update>();
    let keep = plan.keep.is_some();
    let title = title(plan);
    let threads: Arc<Mutex<Option<Started>>> = Arc::default();
    let attached = {
        let threads = threads.clone();
        let stop = stop.clone();
        Box::new(move || {
            // The recorder's messages would tear the screen: they are kept and said after it.
            let log = if terminal {
                stderr_log::StderrLog::capture(&log_file)
                    .map_err(|e| eprintln!("stallscope: {e:#}"))
                    .ok()
            } else {
                None
            };
            let analysis = std::thread::spawn(move || analyse(files, &updates_to, keep));
            let display = std::thread::spawn(move || {
                // The recording ends with the display, even one that panicked.
                let _stop = StopOnDrop(stop);
                if terminal {
                    screen::run(&updates, &title)
                } else {
                    plain(&updates)
                }
            });
            if let Ok(mut t) = threads.lock() {
                *t = Some(Started {
                    analysis,
                    display,
                    log,
                });
            }
        })
    };
    let recorded = recorder::run_with(
        &plan.recording(recording),
        Segments::Hand {
            to: files_to,
            stop,
            attached,
        },
    );
    let started = threads.lock().ok().and_then(|mut t| t.take());
    let mut kept = Vec::new();
    let mut shown = Ok(());
    if let Some(s) = started {
        kept = s.analysis.join().unwrap_or_default();
        shown = s
            .display
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the display panicked")));
        // What the recorder said, now that the screen is gone.
        drop(s.log);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let status = recorded?;
    shown?;
    if let (Some(first), Some(last)) = (kept.first(), kept.last()) {
        eprintln!(
            "stallscope: recording saved to {} … {} ({} one-second files; `stallscope report` \
             reads them)",
            first.display(),
            last.display(),
            kept.len()
        );
    }
    Ok(status)
}

/// The threads `run` starts once attached.
struct Started {
    analysis: std::thread::JoinHandle<Vec<PathBuf>>,
    display: std::thread::JoinHandle<anyhow::Result<()>>,
    log: Option<stderr_log::StderrLog>,
}

struct StopOnDrop(Arc<tokio::sync::Notify>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

/// Each finished second through the pipeline, in order, while the display is there to show
/// it; the files kept, or removed.
fn analyse(files: mpsc::Receiver<PathBuf>, to: &mpsc::Sender<Update>, keep: bool) -> Vec<PathBuf> {
    let mut kept = Vec::new();
    let mut shown = true;
    for file in files {
        if shown {
            let update = match output::segment_report(&file) {
                Ok(doc) => Update::Second(Box::new(doc)),
                Err(e) => Update::Failed(format!("{}: {e:#}", file.display())),
            };
            shown = to.send(update).is_ok();
        }
        if keep {
            kept.push(file);
        } else {
            let _ = std::fs::remove_file(&file);
        }
    }
    kept
}

/// One line a second, for a pipe; ends with the recorder.
fn plain(updates: &mpsc::Receiver<Update>) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut live = Live::default();
    for u in updates {
        match u {
            Update::Second(doc) => {
                live.push(*doc);
                let mut out = std::io::stdout().lock();
                writeln!(out, "{}", live.line())?;
                out.flush()?;
            }
            Update::Failed(e) => eprintln!("stallscope: {e}"),
        }
    }
    Ok(())
}

fn title(plan: &TopPlan) -> String {
    if plan.targets.all_gpu_processes {
        "every GPU process".into()
    } else {
        let pids: Vec<String> = plan.targets.pids.iter().map(u32::to_string).collect();
        format!("PID {}", pids.join(", "))
    }
}
