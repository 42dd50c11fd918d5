// stallscope's HTML report: draws itself from the JSON document in #stallscope-data.
// No network, no libraries: the timeline is one canvas per lane, sharing one view range.
"use strict";
(function () {
  const data = JSON.parse(document.getElementById("stallscope-data").textContent);
  const CAUSE_COLORS = ["#1f77b4", "#ff7f0e", "#8c564b", "#d62728", "#9467bd", "#e377c2",
    "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a", "#c49c94"];
  const STATE_COLORS = { "blocked": "#e4e4e4", "IO wait": "#9467bd", "run queue": "#ff7f0e", "on-CPU": "#2ca02c" };
  const causes = data.causes;
  const ncauses = causes.length;
  const causeColor = (name) => CAUSE_COLORS[Math.max(0, causes.findIndex((c) => c.name === name)) % CAUSE_COLORS.length];

  const el = (tag, attrs, ...children) => {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of children) if (c != null) e.append(c);
    return e;
  };
  const ms = (ns) => (ns / 1e6).toFixed(1) + " ms";
  const secs = (us) => (us / 1e6).toFixed(3) + " s";
  const dur = (us) => (us >= 1e6 ? (us / 1e6).toFixed(2) + " s" : (us / 1e3).toFixed(1) + " ms");
  const pct = (x) => (100 * x).toFixed(1) + "%";

  // The documents of one recording, or of each recording of a job.
  const reports = data.report.recordings ? data.report.recordings : [data.report];

  document.title = data.title;
  const body = document.body;

  // ---- Verdict ----
  const header = el("header", {}, el("h1", { text: data.title }));
  for (const r of reports) {
    const v = r.verdict || {};
    header.append(el("p", { class: "verdict severity-" + (v.severity || "none"), id: "verdict" },
      el("strong", { text: (r.file ? r.file + ": " : "") + (v.severity || "none") + " " }), v.text || ""));
    header.append(el("p", { class: "meta", text: `host ${r.hostname || "?"}, kernel ${r.kernel || "?"}, ` +
      `${secs((r.duration_ns || 0) / 1000)} recorded, stallscope ${r.stallscope_version || ""}` }));
  }
  if (data.report.clock_note) header.append(el("p", { class: "meta", text: data.report.clock_note }));
  body.append(header);

  // ---- What to change: first, the largest gain first ----
  const advice = reports.flatMap((r) => (r.advice || []).map((a) => [r, a]));
  if (advice.length) {
    const list = el("ol", { class: "advice" });
    for (const [r, a] of advice) {
      const ev = el("ul", {});
      for (const e of a.evidence || []) ev.append(el("li", { text: e }));
      list.append(el("li", { "data-cause": a.cause },
        el("strong", { text: `${a.cause} on ${r.file ? r.file + ", " : ""}GPU ${a.gpu} ` +
          `(${a.expected_speedup.toFixed(1)}× faster): ` }), a.change, ev));
    }
    body.append(el("section", { id: "advice" }, el("h2", { text: "What to change" }), list));
  }

  // ---- Cause table ----
  const causeSection = el("section", { id: "causes" }, el("h2", { text: "Where the GPU time went" }));
  for (const r of reports) {
    for (const g of r.gpus || []) {
      const t = el("table", { class: "causes" });
      t.append(el("tr", {}, el("th", { text: "cause" }), el("th", { text: "lost" }),
        el("th", { text: "share of GPU time" }), el("th", { text: "what it means" })));
      const lost = Object.entries(g.lost_by_cause || {}).sort((a, b) => b[1] - a[1]);
      for (const [name, ns] of lost) {
        const c = causes.find((x) => x.name === name) || {};
        t.append(el("tr", { "data-cause": name },
          el("td", {}, el("span", { class: "swatch", style: `background:${causeColor(name)}` }), name),
          el("td", { text: ms(ns) }), el("td", { text: pct(ns / Math.max(1, g.observed_ns)) }),
          el("td", { text: c.description || "" })));
      }
      causeSection.append(el("h3", { text: `${r.file ? r.file + ", " : ""}GPU ${g.index} ${g.name || ""}: ` +
        `busy ${pct((g.busy_ns - (g.waiting_ns || 0)) / Math.max(1, g.observed_ns))}, ` +
        `waiting ${pct((g.waiting_ns || 0) / Math.max(1, g.observed_ns))}, idle ${pct(g.idle_ns / Math.max(1, g.observed_ns))}` }), t);
      const st = g.steps;
      if (st) {
        causeSection.append(el("p", { class: "steps", text: st.step_ms ?
          `steps: ${st.count}, ${st.step_ms.p50.toFixed(1)} ms p50 (p90 ${st.step_ms.p90.toFixed(1)}, ` +
          `p99 ${st.step_ms.p99.toFixed(1)}), found by ${st.found_by}` : `steps: ${st.found_by}` }));
      }
      for (const w of g.what_if || []) {
        causeSection.append(el("p", { class: "what-if", "data-cause": w.cause, text:
          `what if: fixing ${w.cause}: ${w.step_ms_now.toFixed(1)} ms → ${w.step_ms_if_fixed.toFixed(1)} ms per step ` +
          `(${w.speedup.toFixed(1)}×, ${w.speedup_low.toFixed(1)}–${w.speedup_high.toFixed(1)}×); ` +
          `${w.limited_next_by} limits next` }));
      }
    }
  }
  body.append(causeSection);

  // ---- Timeline ----
  const tl = el("section", { id: "timeline" }, el("h2", { text: "Timeline" }),
    el("p", { class: "hint", text: "Wheel to zoom, drag to pan, double-click to see it all. " +
      "Hover for numbers; click a stall (the strip on top of a GPU lane) for its evidence." }));
  const legend = el("div", { class: "legend" });
  for (const c of causes) legend.append(el("span", {}, el("span", { class: "swatch", style: `background:${causeColor(c.name)}` }), c.name));
  for (const [s, col] of Object.entries(STATE_COLORS)) legend.append(el("span", {}, el("span", { class: "swatch", style: `background:${col}` }), s));
  tl.append(legend);
  const lanesBox = el("div", { id: "lanes" });
  tl.append(lanesBox);
  const tooltip = el("div", { id: "tooltip", class: "hidden" });
  const evidence = el("div", { id: "evidence", class: "hidden" });
  tl.append(evidence);
  body.append(tl, tooltip);

  let total = 1;
  for (const r of data.recordings) total = Math.max(total, r.offset_us + r.duration_us);
  const view = { t0: 0, t1: total };
  const lanes = [];

  function find(list, t) {
    // The last entry starting at or before t, if it covers t.
    let lo = 0, hi = list.length - 1, at = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (list[mid][0] <= t) { at = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return at >= 0 && list[at][1] >= t ? at : -1;
  }

  function addLane(kind, label, attrs, draw, hover, click) {
    const canvas = el("canvas", {});
    const lane = el("div", Object.assign({ class: "lane " + kind, "data-kind": kind }, attrs),
      el("div", { class: "label", title: label, text: label }), canvas);
    lanesBox.append(lane);
    const entry = { kind, lane, canvas, draw, hover, click, attrs };
    lanes.push(entry);
    return entry;
  }

  const xOf = (canvas, t) => ((t - view.t0) / (view.t1 - view.t0)) * canvas.clientWidth;
  const tOf = (canvas, x) => view.t0 + (x / canvas.clientWidth) * (view.t1 - view.t0);

  function fillSpans(ctx, canvas, list, offset, y, h, color) {
    for (const e of list) {
      const a = e[0] + offset, b = e[1] + offset;
      if (b < view.t0 || a > view.t1) continue;
      const x0 = xOf(canvas, a), x1 = xOf(canvas, b);
      ctx.fillStyle = color(e);
      ctx.fillRect(x0, y, Math.max(1, x1 - x0), h);
    }
  }

  data.recordings.forEach((rec, ri) => {
    const off = rec.offset_us;
    lanesBox.append(el("div", { class: "group", text: `${rec.host || "host"} — ${rec.name}` }));
    for (const g of rec.gpus) {
      const stalls = g.stalls.map((s) => [s.start_us, s.end_us, s]).sort((a, b) => a[0] - b[0]);
      addLane("gpu", `GPU ${g.index} ${g.name}`, { "data-recording": ri, "data-gpu": g.index },
        (ctx, c, h) => {
          ctx.fillStyle = "#c6dbef";
          ctx.fillRect(xOf(c, off), 7, xOf(c, off + rec.duration_us) - xOf(c, off), h - 7);
          fillSpans(ctx, c, g.lost, off, 7, h - 7, (e) => {
            const k = e[2] % ncauses;
            return e[2] >= ncauses ? shade(causeColor(causes[k].name)) : causeColor(causes[k].name);
          });
          fillSpans(ctx, c, stalls, off, 0, 6, (e) => causeColor(e[2].cause));
        },
        (t, y) => {
          const rt = t - off;
          if (y < 7) {
            const i = find(stalls, rt);
            if (i >= 0) return stallText(stalls[i][2]) + "\nclick for its evidence";
          }
          const i = find(g.lost, rt);
          const u = nearestBefore(g.util, rt);
          let s = `GPU ${g.index} at ${secs(rt)}` + (u ? `: NVML utilization ${u[1]}%` : "");
          const sm = nearestBefore(g.sm, rt);
          if (sm) s += `, SM active ${sm[1]}% (GPM)`;
          if (i >= 0) {
            const e = g.lost[i], k = e[2] % ncauses;
            s += `\n${e[2] >= ncauses ? "waiting" : "idle"}: ${causes[k].name}, ${dur(e[1] - e[0])}`;
          }
          return s;
        },
        (t) => {
          const i = find(stalls, t - off);
          if (i >= 0) showEvidence(g, stalls[i][2], rec);
        }).stalls = stalls;
      if ((g.steps || []).length) {
        const parts = ["input wait", "copy", "host", "gpu", "collective"];
        addLane("steps", `GPU ${g.index} training steps`, { "data-recording": ri, "data-gpu": g.index },
          (ctx, c, h) => {
            let n = 0;
            fillSpans(ctx, c, g.steps, off, 2, h - 4, () => (n++ % 2 ? "#9ecae1" : "#4292c6"));
          },
          (t) => {
            const i = find(g.steps, t - off);
            if (i < 0) return `GPU ${g.index}: between steps`;
            const s = g.steps[i];
            return `step ${i + 1}: ${dur(s[1] - s[0])}\n` +
              parts.map((p, k) => `${p} ${s[k + 2].toFixed(1)} ms`).join(", ");
          });
      }
    }
    for (const p of rec.processes) {
      const rank = p.rank != null ? ` · rank ${p.rank}` : p.is_rank ? " · rank ?" : "";
      addLane("process", `${p.name} (pid ${p.pid}${rank})`, { "data-recording": ri, "data-pid": p.pid },
        (ctx, c, h) => fillSpans(ctx, c, p.collectives, off, 2, h - 4, () => "#6a3d9a"),
        (t) => {
          const i = find(p.collectives, t - off);
          return i >= 0 ? `NCCL collective, queued to done: ${dur(p.collectives[i][1] - p.collectives[i][0])}`
            : `process ${p.pid}: ${p.cmdline}`;
        });
      for (const th of p.threads) {
        if (!shown(th)) continue;
        addLane("thread", `${th.name} ${th.tid} (${th.role})`, { "data-recording": ri, "data-pid": p.pid, "data-tid": th.tid },
          (ctx, c, h) => {
            fillSpans(ctx, c, th.states, off, 0, h - 5, (e) => STATE_COLORS[data.states[e[2]]]);
            fillSpans(ctx, c, th.cuda, off, h - 4, 4, () => "#000");
          },
          (t, y, h) => {
            const rt = t - off;
            if (y > h - 5) {
              const i = find(th.cuda, rt);
              if (i >= 0) return `${th.cuda_names[th.cuda[i][2]]}: ${dur(th.cuda[i][1] - th.cuda[i][0])}`;
            }
            const i = find(th.states, rt);
            return i >= 0 ? `${th.name} ${th.tid}: ${data.states[th.states[i][2]]} for ${dur(th.states[i][1] - th.states[i][0])}` : `${th.name} ${th.tid}`;
          });
      }
    }
  });

  // Threads that only ever slept are left out of the timeline (they stay in the table).
  function shown(th) {
    if (th.role !== "other") return true;
    return th.states.some((e) => data.states[e[2]] !== "blocked");
  }
  function nearestBefore(list, t) {
    let lo = 0, hi = list.length - 1, at = -1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (list[mid][0] <= t) { at = mid; lo = mid + 1; } else hi = mid - 1;
    }
    return at >= 0 ? list[at] : null;
  }
  function shade(hex) {
    const n = parseInt(hex.slice(1), 16);
    const f = (v) => Math.round(v * 0.6).toString(16).padStart(2, "0");
    return "#" + f(n >> 16) + f((n >> 8) & 255) + f(n & 255);
  }
  function stallText(s) {
    return `stall: ${s.cause}, ${dur(s.end_us - s.start_us)} from ${secs(s.start_us)}; ` +
      `idle ${s.idle_ms.toFixed(1)} ms, waiting ${s.waiting_ms.toFixed(1)} ms`;
  }

  function redraw() {
    for (const l of lanes) {
      const c = l.canvas, dpr = window.devicePixelRatio || 1;
      const w = c.clientWidth, h = c.clientHeight;
      if (c.width !== Math.round(w * dpr) || c.height !== Math.round(h * dpr)) {
        c.width = Math.round(w * dpr);
        c.height = Math.round(h * dpr);
      }
      const ctx = c.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, w, h);
      l.draw(ctx, c, h);
    }
    ruler.textContent = `${secs(view.t0)} … ${secs(view.t1)} (${dur(view.t1 - view.t0)} shown)`;
  }
  const ruler = el("div", { class: "ruler" });
  tl.insertBefore(ruler, lanesBox);

  function zoomTo(t0, t1) {
    const span = Math.max(10, t1 - t0);
    view.t0 = Math.max(0, t0);
    view.t1 = Math.min(total, view.t0 + span);
    redraw();
  }

  let drag = null;
  for (const l of lanes) {
    const c = l.canvas;
    c.addEventListener("wheel", (ev) => {
      ev.preventDefault();
      const t = tOf(c, ev.offsetX), k = ev.deltaY > 0 ? 1.25 : 0.8;
      zoomTo(t - (t - view.t0) * k, t + (view.t1 - t) * k);
    }, { passive: false });
    c.addEventListener("mousedown", (ev) => { drag = { x: ev.clientX, t0: view.t0, t1: view.t1, moved: false, c }; });
    c.addEventListener("mousemove", (ev) => {
      const text = l.hover(tOf(c, ev.offsetX), ev.offsetY, c.clientHeight);
      tooltip.textContent = text || "";
      tooltip.classList.toggle("hidden", !text);
      tooltip.style.left = ev.pageX + 12 + "px";
      tooltip.style.top = ev.pageY + 12 + "px";
    });
    c.addEventListener("mouseleave", () => tooltip.classList.add("hidden"));
    c.addEventListener("click", (ev) => {
      if (drag && drag.moved) return;
      if (l.click) l.click(tOf(c, ev.offsetX), ev.offsetY);
    });
    c.addEventListener("dblclick", () => zoomTo(0, total));
  }
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x;
    if (Math.abs(dx) > 3) drag.moved = true;
    const dt = (dx / drag.c.clientWidth) * (drag.t1 - drag.t0);
    const span = drag.t1 - drag.t0;
    view.t0 = Math.min(Math.max(0, drag.t0 - dt), total - span);
    view.t1 = view.t0 + span;
    redraw();
  });
  window.addEventListener("mouseup", () => setTimeout(() => { drag = null; }, 0));
  window.addEventListener("resize", redraw);

  function showEvidence(g, s, rec) {
    evidence.replaceChildren();
    evidence.classList.remove("hidden");
    const c = causes.find((x) => x.name === s.cause) || {};
    evidence.append(el("h3", {}, el("span", { class: "swatch", style: `background:${causeColor(s.cause)}` }),
      `Stall on GPU ${g.index}: ${s.cause}`),
      el("p", { class: "cause-description", text: c.description || "" }),
      el("p", { text: `${dur(s.end_us - s.start_us)} from ${secs(s.start_us)} (${rec.name}); idle ${s.idle_ms.toFixed(1)} ms, ` +
        `waiting ${s.waiting_ms.toFixed(1)} ms` + (s.reason ? `; ${s.reason}` : "") }));
    if (c.fix) evidence.append(el("p", { class: "fix", text: "What to try: " + c.fix }));
    const ev = s.evidence || {};
    if (ev.threads && ev.threads.length) {
      const t = el("table", {}, el("tr", {}, ...["thread", "role", "on-CPU", "run queue", "IO wait", "blocked"].map((h) => el("th", { text: h }))));
      for (const th of ev.threads) t.append(el("tr", {}, el("td", { text: `${th.comm} ${th.tid} (pid ${th.pid})` }), el("td", { text: th.role }),
        el("td", { text: ms(th.on_cpu_ns) }), el("td", { text: ms(th.runqueue_ns) }), el("td", { text: ms(th.io_wait_ns) }), el("td", { text: ms(th.blocked_ns) })));
      evidence.append(el("h4", { text: "Threads" }), t);
    }
    if (ev.stacks && ev.stacks.length) {
      evidence.append(el("h4", { text: "Stacks (leaf last)" }));
      for (const st of ev.stacks) {
        evidence.append(el("details", {}, el("summary", { text: `${st.weight} ${st.unit}: ${st.frames[st.frames.length - 1] || "?"}` }),
          el("pre", { text: st.frames.join("\n") })));
      }
    }
    for (const k of ["block_io", "cuda"]) {
      if (ev[k]) evidence.append(el("h4", { text: k === "cuda" ? "CUDA" : "Block IO" }), el("pre", { text: JSON.stringify(ev[k], null, 2) }));
    }
    evidence.append(el("button", { text: "zoom to this stall", onclick: () => zoomTo(rec.offset_us + s.start_us - (s.end_us - s.start_us), rec.offset_us + s.end_us + (s.end_us - s.start_us)) }));
  }

  // ---- Stalls ----
  const stallSection = el("section", { id: "stalls" }, el("h2", { text: "Stalls, longest first" }));
  data.recordings.forEach((rec) => {
    for (const g of rec.gpus) {
      const list = g.stalls.slice().sort((a, b) => (b.idle_ms + b.waiting_ms) - (a.idle_ms + a.waiting_ms));
      if (!list.length) continue;
      const t = el("table", {}, el("tr", {}, ...["GPU", "cause", "from", "length", "idle", "waiting"].map((h) => el("th", { text: h }))));
      for (const s of list) {
        t.append(el("tr", { class: "clickable", onclick: () => showEvidence(g, s, rec) },
          el("td", { text: `${rec.name} GPU ${g.index}` }), el("td", {}, el("span", { class: "swatch", style: `background:${causeColor(s.cause)}` }), s.cause),
          el("td", { text: secs(s.start_us) }), el("td", { text: dur(s.end_us - s.start_us) }),
          el("td", { text: s.idle_ms.toFixed(1) + " ms" }), el("td", { text: s.waiting_ms.toFixed(1) + " ms" })));
      }
      stallSection.append(t);
    }
  });
  body.append(stallSection);

  // ---- Flame graphs ----
  const fg = el("section", { id: "flamegraphs" }, el("h2", { text: "Flame graphs" }));
  if (!data.flamegraphs.length) fg.append(el("p", { text: "None: the report was made with --no-flamegraphs." }));
  const tabs = el("div", { class: "tabs" });
  const frame = el("iframe", { class: "flamegraph", title: "flame graph" });
  // Each graph in its own frame, so that its script (zoom, search) keeps to itself; inferno
  // sizes it to its parent's width.
  const framed = (svg) => "<!DOCTYPE html><html><head><style>html,body{margin:0}svg{display:block;width:100%;height:auto}</style>" +
    "</head><body>" + svg.replace(/^<\?xml[^>]*>/, "").replace(/^<!DOCTYPE[^>]*>/, "") + "</body></html>";
  data.flamegraphs.forEach((f) => {
    tabs.append(el("button", { text: f.name, "data-graph": f.name, onclick: () => { frame.srcdoc = framed(f.svg); } }));
  });
  if (data.flamegraphs.length) frame.srcdoc = framed(data.flamegraphs[0].svg);
  if (data.flamegraphs.length) fg.append(tabs, frame);
  body.append(fg);

  // ---- Threads ----
  const ths = el("section", { id: "threads" }, el("h2", { text: "Threads" }));
  for (const r of reports) {
    const t = el("table", {}, el("tr", {}, ...["thread", "pid", "on-CPU", "run queue", "IO wait", "blocked", "block IO", "read"].map((h) => el("th", { text: h }))));
    for (const th of (r.threads || []).slice().sort((a, b) => b.on_cpu_ns - a.on_cpu_ns)) {
      t.append(el("tr", {}, el("td", { text: `${th.comm} ${th.tid}` }), el("td", { text: th.pid }),
        el("td", { text: ms(th.on_cpu_ns) }), el("td", { text: ms(th.runqueue_ns) }), el("td", { text: ms(th.io_wait_ns) }),
        el("td", { text: ms(th.blocked_ns) }), el("td", { text: (th.block_io && th.block_io.count) || 0 }), el("td", { text: th.read_bytes })));
    }
    ths.append(t);
  }
  body.append(ths);

  // ---- CUDA ----
  const cu = el("section", { id: "cuda" }, el("h2", { text: "CUDA and NCCL calls" }));
  for (const r of reports) {
    for (const p of (r.cuda && r.cuda.processes) || []) {
      const t = el("table", {}, el("tr", {}, ...["call", "calls", "total", "errors", "from"].map((h) => el("th", { text: h }))));
      for (const c of p.calls || []) {
        t.append(el("tr", {}, el("td", { text: c.api }), el("td", { text: c.calls }), el("td", { text: ms(c.total_ns) }),
          el("td", { text: c.errors }), el("td", { text: (c.callers || []).map((x) => `${x.caller} (${x.calls})`).join(", ") })));
      }
      cu.append(el("h3", { text: `pid ${p.pid}: pageable copies ${p.pageable_copy_bytes} B, pinned ${p.pinned_copy_bytes} B` }), t);
    }
  }
  body.append(cu);

  redraw();
  // For tests and the curious: the lanes, and where a stall sits on screen.
  window.stallscope = {
    lanes: () => lanes.map((l) => Object.assign({ kind: l.kind }, l.attrs)),
    stallPoint(recording, gpu, i) {
      const l = lanes.find((x) => x.kind === "gpu" && x.attrs["data-recording"] === recording && x.attrs["data-gpu"] === gpu);
      const s = l.stalls[i];
      const off = data.recordings[recording].offset_us;
      const r = l.canvas.getBoundingClientRect();
      const mid = off + (s[0] + s[1]) / 2;
      if (mid < view.t0 || mid > view.t1) zoomTo(0, total);
      return { x: r.left + xOf(l.canvas, mid), y: r.top + 3, cause: s[2].cause };
    },
    zoomTo,
  };
})();
