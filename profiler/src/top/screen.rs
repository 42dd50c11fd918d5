//! The live screen (ratatui over crossterm): drawn from [`Live`] each time a second arrives or
//! a key is pressed; fits 80×24.
use std::{sync::mpsc, time::Duration};

use profiler_core::{
    live::{Live, RECENT},
    report::json::ReportDoc,
};
use ratatui::{
    Frame,
    crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers},
    layout::{Constraint, Layout, Rect},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Paragraph, Row, Sparkline, Table},
};

use super::Update;

/// What the user chose to look at.
#[derive(Default)]
pub struct View {
    /// Position in `Live::gpus`.
    gpu: usize,
    /// Position in the GPU's causes; `None`: the top one.
    cause: Option<usize>,
    /// Seconds that arrived while frozen, shown on thaw.
    held: Option<Vec<ReportDoc>>,
    /// The last second that could not be analysed.
    note: Option<String>,
}

/// Runs the screen until `q`, Ctrl-C, or the recorder's end (the channel closed).
pub fn run(updates: &mpsc::Receiver<Update>, title: &str) -> anyhow::Result<()> {
    let mut terminal = ratatui::init();
    let r = show(&mut terminal, updates, title);
    ratatui::restore();
    r
}

fn show(
    terminal: &mut ratatui::DefaultTerminal,
    updates: &mpsc::Receiver<Update>,
    title: &str,
) -> anyhow::Result<()> {
    let mut live = Live::default();
    let mut view = View::default();
    loop {
        terminal.draw(|f| draw(f, &live, &view, title))?;
        if event::poll(Duration::from_millis(200))?
            && let Event::Key(k) = event::read()?
            && k.kind == KeyEventKind::Press
            && pressed(k, &mut view, &mut live)
        {
            return Ok(());
        }
        loop {
            match updates.try_recv() {
                Ok(Update::Second(doc)) => match view.held.as_mut() {
                    Some(held) => {
                        // Live keeps no more than its minute: neither does a long freeze.
                        if held.len() == profiler_core::live::HISTORY {
                            held.remove(0);
                        }
                        held.push(*doc);
                    }
                    None => live.push(*doc),
                },
                Ok(Update::Failed(e)) => view.note = Some(e),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => return Ok(()),
            }
        }
    }
}

/// Acts on a key; says whether it quits.
fn pressed(k: event::KeyEvent, view: &mut View, live: &mut Live) -> bool {
    let ctrl_c = k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
    match k.code {
        _ if ctrl_c => return true,
        KeyCode::Char('q') | KeyCode::Esc => return true,
        KeyCode::Char('g') => {
            view.gpu = (view.gpu + 1) % live.gpus().len().max(1);
            view.cause = None;
        }
        KeyCode::Char('c') => {
            let causes = selected_gpu(live, view).map_or(0, |g| g.causes.len());
            view.cause = Some(view.cause.map_or(1, |c| c + 1) % causes.max(1));
        }
        KeyCode::Char('t') => view.cause = None,
        KeyCode::Char(' ') | KeyCode::Char('f') => match view.held.take() {
            Some(held) => held.into_iter().for_each(|d| live.push(d)),
            None => view.held = Some(Vec::new()),
        },
        _ => {}
    }
    false
}

fn selected_gpu(live: &Live, view: &View) -> Option<profiler_core::live::GpuNow> {
    let gpus = live.gpus();
    let index = *gpus.get(view.gpu.min(gpus.len().saturating_sub(1)))?;
    live.gpu(index)
}

fn pct(share: f64) -> String {
    format!("{:.0}%", share * 100.0)
}

/// The whole screen.
pub fn draw(f: &mut Frame, live: &Live, view: &View, title: &str) {
    let [header, split, spark, step, middle, frames, keys] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Length(1),
        Constraint::Min(6),
        Constraint::Length(6),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let gpus = live.gpus();
    let gpu = selected_gpu(live, view);
    let head = match &gpu {
        Some(g) => format!(
            "stallscope top · {title} · {} s · GPU {} {} [{}/{}]",
            live.seen(),
            g.index,
            g.name,
            view.gpu.min(gpus.len().saturating_sub(1)) + 1,
            gpus.len()
        ),
        None if live.seen() == 0 => {
            format!("stallscope top · {title} · waiting for the first second…")
        }
        None => format!(
            "stallscope top · {title} · {} s · no GPU sampled",
            live.seen()
        ),
    };
    f.render_widget(
        Paragraph::new(head).style(Style::new().add_modifier(Modifier::BOLD)),
        header,
    );
    keys_line(f, keys, view);
    let Some(g) = gpu else { return };
    let cause = match view.cause {
        Some(i) => g.causes.get(i.min(g.causes.len().saturating_sub(1))),
        None => g.top_cause(),
    }
    .map(|(c, ns)| (c.clone(), *ns));
    let mut line = format!(
        "busy {}  waiting {}  idle {}   (last {RECENT} s)",
        pct(g.share(g.busy_ns.saturating_sub(g.waiting_ns))),
        pct(g.share(g.waiting_ns)),
        pct(g.share(g.idle_ns))
    );
    if let Some((c, ns)) = g.top_cause() {
        line += &format!("   top cause: {c} {}", pct(g.share(*ns)));
    }
    f.render_widget(Paragraph::new(line), split);
    let [label, chart] =
        Layout::horizontal([Constraint::Length(18), Constraint::Min(10)]).areas(spark);
    f.render_widget(Paragraph::new("busy, last minute"), label);
    let data: Vec<u64> = g
        .busy_history
        .iter()
        .map(|b| b.map_or(0, |b| (b * 100.0).round() as u64))
        .collect();
    let shown = &data[data.len().saturating_sub(chart.width as usize)..];
    f.render_widget(Sparkline::default().data(shown).max(100), chart);
    let steps = live.steps(g.index, cause.as_ref().map(|c| c.0.as_str()));
    let step_line = match steps {
        Some(s) => match s.if_fixed {
            Some((c, ms, speedup)) => format!(
                "step {:.0} ms (p50) · fixing {c}: {ms:.0} ms, {speedup:.2}× faster",
                s.step_ms_p50
            ),
            None => format!("step {:.0} ms (p50)", s.step_ms_p50),
        },
        None => "step: none found yet".into(),
    };
    f.render_widget(Paragraph::new(step_line), step);
    let [left, right] =
        Layout::horizontal([Constraint::Length(30), Constraint::Min(40)]).areas(middle);
    let rows = g.causes.iter().enumerate().map(|(i, (c, ns))| {
        let row = Row::new(vec![c.clone(), pct(g.share(*ns))]);
        if cause.as_ref().is_some_and(|(sel, _)| sel == c) && i < g.causes.len() {
            row.style(Style::new().add_modifier(Modifier::REVERSED))
        } else {
            row
        }
    });
    f.render_widget(
        Table::new(rows, [Constraint::Min(18), Constraint::Length(5)]).block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!("causes, {RECENT} s")),
        ),
        left,
    );
    let threads = live.threads(right.height.saturating_sub(3) as usize);
    let rows = threads.iter().map(|t| {
        let total = (t.active_ns() + t.blocked_ns).max(1) as f64;
        Row::new(vec![
            t.tid.to_string(),
            t.comm.clone(),
            pct(t.on_cpu_ns as f64 / total),
            pct(t.runqueue_ns as f64 / total),
            pct(t.io_wait_ns as f64 / total),
            pct(t.blocked_ns as f64 / total),
        ])
    });
    let widths = [
        Constraint::Length(7),
        Constraint::Min(10),
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Length(5),
    ];
    f.render_widget(
        Table::new(rows, widths)
            .header(Row::new(vec![
                "TID", "thread", "cpu", "runq", "io", "sleep",
            ]))
            .block(Block::default().borders(Borders::ALL).title("threads")),
        right,
    );
    let Some((cause, _)) = cause else { return };
    let found = live.frames(g.index, &cause);
    let total = |v: &[(String, u64)]| v.iter().map(|x| x.1).sum::<u64>().max(1) as f64;
    let mut lines = Vec::new();
    for (kind, list) in [("py ", &found.python), ("native", &found.native)] {
        let all = total(list);
        for (name, w) in list.iter().take(2) {
            lines.push(Line::from(format!(
                "{kind:<6} {:>4}  {name}",
                pct(*w as f64 / all)
            )));
        }
    }
    if lines.is_empty() {
        lines.push(Line::from("no stacks for this cause in the last seconds"));
    }
    f.render_widget(
        Paragraph::new(lines).block(
            Block::default()
                .borders(Borders::ALL)
                .title(format!("behind {cause}")),
        ),
        frames,
    );
}

fn keys_line(f: &mut Frame, area: Rect, view: &View) {
    let mut keys = "g GPU  c cause  t top cause  space freeze  q quit".to_string();
    if view.held.is_some() {
        keys += "   [FROZEN]";
    }
    if let Some(n) = &view.note {
        keys += &format!("   {n}");
    }
    f.render_widget(
        Paragraph::new(keys).style(Style::new().add_modifier(Modifier::DIM)),
        area,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::{Terminal, backend::TestBackend};

    fn second() -> ReportDoc {
        let ms = 1_000_000u64;
        let v = serde_json::json!({
            "version": profiler_core::report::json::JSON_VERSION,
            "gpus": [{
                "index": 0, "name": "Sim", "uuid": "GPU-0", "observed_ns": 1000 * ms,
                "busy_ns": 300 * ms, "waiting_ns": 0, "idle_ns": 700 * ms,
                "idle_by_cause": {"dataloader_cpu": 650 * ms, "disk": 50 * ms},
                "causes": [{"cause": "dataloader_cpu", "idle_ns": 650 * ms, "windows": 1,
                    "evidence": {"threads": [], "stacks": [{"weight": 9, "unit": "samples",
                        "frames": ["_start", "worker_loop (worker.py:300)", "decode (data.py:42)", "decode_jpeg"]}]}}]
            }],
            "threads": [{"tid": 4242, "pid": 4242, "comm": "pt_data_worker", "on_cpu_ns": 950 * ms}]
        });
        profiler_core::report::json::read_report(v.to_string().as_bytes(), "test").unwrap()
    }

    fn screen(live: &Live, view: &View) -> String {
        let mut t = Terminal::new(TestBackend::new(80, 24)).unwrap();
        t.draw(|f| draw(f, live, view, "PID 1")).unwrap();
        let buf = t.backend().buffer().clone();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn an_80_by_24_screen_names_the_cause_its_code_and_the_threads() {
        let mut live = Live::default();
        live.push(second());
        let s = screen(&live, &View::default());
        for want in [
            "busy 30%",
            "idle 70%",
            "top cause: dataloader_cpu 65%",
            "behind dataloader_cpu",
            "decode (data.py:42)",
            "decode_jpeg",
            "pt_data_worker",
            "q quit",
        ] {
            assert!(s.contains(want), "no {want:?} on the screen:\n{s}");
        }
    }

    #[test]
    fn c_moves_to_the_next_cause_and_frozen_is_said() {
        let mut live = Live::default();
        live.push(second());
        let view = View {
            cause: Some(1),
            held: Some(Vec::new()),
            ..View::default()
        };
        let s = screen(&live, &view);
        assert!(s.contains("behind disk"), "{s}");
        assert!(s.contains("no stacks for this cause"), "{s}");
        assert!(s.contains("[FROZEN]"), "{s}");
    }

    #[test]
    fn before_the_first_second_it_says_it_is_waiting() {
        let s = screen(&Live::default(), &View::default());
        assert!(s.contains("waiting for the first second"), "{s}");
    }
}
