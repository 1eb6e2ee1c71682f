// troupe's dashboard: the jobs page and a job's page, served by the
// controller (docs/dashboard.md). Text from the server only ever enters the
// page as text nodes, never as HTML.
"use strict";
(() => {
  const $ = (sel, el = document) => el.querySelector(sel);
  let csrf = "";

  // ---- small helpers ----
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids.flat()) {
      if (kid === undefined || kid === null) continue;
      el.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
    }
    return el;
  }
  const num = (x) => (x === undefined || x === null || x === "" ? 0 : Number(x));
  const stateOf = (job) => String(job.state || "").replace("JOB_STATE_", "").toLowerCase();
  const isFinal = (s) => ["succeeded", "failed", "cancelled", "lost"].includes(s);
  function fmtDuration(s) {
    s = Math.max(0, Math.round(num(s)));
    if (!s) return "–";
    const hh = Math.floor(s / 3600), mm = Math.floor((s % 3600) / 60), ss = s % 60;
    return hh ? `${hh}h ${mm}m` : mm ? `${mm}m ${ss}s` : `${ss}s`;
  }
  function fmtTime(us) {
    us = num(us);
    return us ? new Date(us / 1000).toLocaleString() : "–";
  }
  function fmtNum(v) {
    if (v === undefined || v === null) return "–";
    v = Number(v);
    if (!isFinite(v)) return String(v);
    const a = Math.abs(v);
    return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(3) : String(+v.toFixed(4));
  }
  function fmtBytes(b) {
    b = num(b);
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (b >= 1024 && i < u.length - 1) (b /= 1024), i++;
    return `${b.toFixed(i ? 1 : 0)} ${u[i]}`;
  }
  const score = (m) => (m || {})["val/score/mean"] ?? (m || {})["critic/score/mean"];

  async function api(path, opts = {}) {
    const r = await fetch(path, { credentials: "same-origin", ...opts });
    if (r.status === 401) {
      location.href = "/login";
      throw new Error("not logged in");
    }
    const body = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
    return body;
  }
  const post = (path) => api(path, { method: "POST", headers: { "X-CSRF-Token": csrf } });

  function progress(job) {
    const total = num(job.total), it = num(job.iteration);
    const pct = total ? Math.min(100, (100 * it) / total) : isFinal(stateOf(job)) ? 100 : 0;
    return h("div", { class: "bar", title: `${it} / ${total}` }, h("span", { style: `width:${pct}%` }));
  }
  const badge = (s) => h("span", { class: `state ${s}`, "data-state": s }, s);

  // ---- the jobs page ----
  async function jobsPage(app) {
    $("#where").textContent = "jobs";
    const body = h("tbody");
    app.replaceChildren(
      h("div", { class: "card" },
        h("h2", {}, "Jobs"),
        h("table", { id: "jobs" },
          h("thead", {}, h("tr", {}, ["Job", "State", "Stage", "Progress", "ETA", "Score", "Started"].map((t) => h("th", {}, t)))),
          body)));
    const refresh = async () => {
      const { jobs } = await api("/api/jobs");
      body.replaceChildren(...jobs.map((j) => {
        const s = stateOf(j);
        return h("tr", { "data-id": j.id },
          h("td", {}, h("a", { href: `/jobs/${encodeURIComponent(j.id)}` }, j.name || j.id), h("div", { class: "muted" }, j.id)),
          h("td", {}, badge(s), s === "queued" && j.queue_position ? h("span", { class: "muted" }, ` #${j.queue_position}`) : null),
          h("td", {}, j.stage || "–"),
          h("td", {}, progress(j), h("span", { class: "muted" }, `${num(j.iteration)} / ${num(j.total)}`)),
          h("td", {}, isFinal(s) ? "–" : fmtDuration(j.eta_s)),
          h("td", {}, fmtNum(score(j.last_metrics))),
          h("td", {}, fmtTime(j.start_time_us || j.submit_time_us)));
      }));
      if (!jobs.length) body.append(h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No jobs yet: troupe submit FILE")));
    };
    await refresh();
    setLive(true);
    const timer = setInterval(() => refresh().then(() => setLive(true), () => setLive(false)), 1000);
    window.addEventListener("pagehide", () => clearInterval(timer));
  }

  function setLive(ok) {
    const c = $("#conn");
    c.classList.toggle("live", ok);
    c.classList.toggle("lost", !ok);
  }

  // ---- charts ----
  const CHARTS = [
    ["Score", ["val/score/mean", "critic/score/mean"]],
    ["KL", ["actor/ppo_kl", "actor/reward_kl_penalty"]],
    ["Entropy", ["actor/entropy"]],
    ["Policy loss", ["actor/pg_loss"]],
    ["Value loss", ["critic/vf_loss"]],
    ["Clip fractions", ["actor/pg_clipfrac", "actor/pg_clipfrac_lower", "critic/vf_clipfrac"]],
    ["Response length", ["response_length/mean", "response_length/max"]],
    ["Throughput (tokens/s)", ["perf/throughput", "rollout/tokens_per_s"]],
    ["Rollout KV use and prefix hits", ["rollout/kv_utilization", "rollout/prefix_hit_rate"]],
    ["SFT loss", ["sft/loss"]],
    ["Reward model", ["rm/loss", "rm/accuracy", "rm/eval_accuracy"]],
  ];
  const COLORS = ["#2f6fde", "#d64545", "#1f9d55", "#c98a00", "#8a5cd1", "#0f9aa8", "#e0629a", "#6b7383"];

  // Series of one stage: key -> {x: [], y: []} (steps ascending).
  class SeriesBook {
    constructor() { this.stages = {}; }
    load(series) {
      for (const [stage, keys] of Object.entries(series || {})) {
        const s = (this.stages[stage] = this.stages[stage] || {});
        for (const [k, v] of Object.entries(keys)) s[k] = { x: v.step.map(Number), y: v.value.map((y) => (y === null ? null : Number(y))) };
      }
    }
    add(stage, step, metrics) {
      const s = (this.stages[stage] = this.stages[stage] || {});
      for (const [k, v] of Object.entries(metrics || {})) {
        const e = (s[k] = s[k] || { x: [], y: [] });
        const last = e.x.length ? e.x[e.x.length - 1] : -Infinity;
        if (step > last) e.x.push(step), e.y.push(v === null ? null : Number(v));
        else { // a re-run step after a resume: drop what it replaces
          const i = e.x.findIndex((x) => x >= step);
          e.x.length = i, e.y.length = i;
          e.x.push(step), e.y.push(v === null ? null : Number(v));
        }
      }
    }
    // uPlot's aligned data for `keys` of `stage`.
    aligned(stage, keys) {
      const s = this.stages[stage] || {};
      const present = keys.filter((k) => s[k] && s[k].x.length);
      if (!present.length) return null;
      const xs = [...new Set(present.flatMap((k) => s[k].x))].sort((a, b) => a - b);
      const idx = new Map(xs.map((x, i) => [x, i]));
      const ys = present.map((k) => {
        const col = new Array(xs.length).fill(null);
        s[k].x.forEach((x, i) => (col[idx.get(x)] = s[k].y[i]));
        return col;
      });
      return { keys: present, data: [xs, ...ys] };
    }
  }

  class ChartGrid {
    constructor(root, book) {
      this.root = root;
      this.book = book;
      this.charts = new Map(); // title -> {u, keys}
      this.stage = null;
      this.extra = [];
    }
    render() {
      const stage = this.stage;
      const defs = CHARTS.concat(this.extra.map((k) => [k, [k]]));
      for (const [title, keys] of defs) {
        const a = this.book.aligned(stage, keys);
        let c = this.charts.get(title);
        if (!a) continue;
        if (c && c.keys.join() !== a.keys.join()) {
          c.u.destroy();
          c.box.remove();
          this.charts.delete(title);
          c = null;
        }
        if (!c) {
          const box = h("div", { class: "chart", "data-chart": title }, h("div", { class: "title" }, title));
          this.root.append(box);
          const width = Math.max(300, box.clientWidth - 12);
          const u = new uPlot({
            width, height: 200,
            scales: { x: { time: false } },
            legend: { live: true },
            series: [{ label: "step" }, ...a.keys.map((k, i) => ({ label: k, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true }))],
            axes: [{}, { size: 60 }],
          }, a.data, box);
          c = { u, keys: a.keys, box };
          this.charts.set(title, c);
        } else {
          c.u.setData(a.data);
        }
        c.box.dataset.points = String(a.data[0].length);
      }
    }
    reset(stage) {
      for (const c of this.charts.values()) c.u.destroy(), c.box.remove();
      this.charts.clear();
      this.stage = stage;
      this.render();
    }
  }

  // ---- the step anatomy: stacked timing_s/* bars per iteration ----
  const PHASE_COLORS = { gen: "#2f6fde", gen_wait: "#7aa2ec", old_log_prob: "#0f9aa8", ref: "#5bc0c9", values: "#8a5cd1", reward: "#c98a00", adv: "#e0b84f", update_critic: "#d64545", update_actor: "#e0629a", weight_sync: "#1f9d55", offload: "#6b7383", testing: "#b8bec9" };
  function drawAnatomy(canvas, legend, book, stage) {
    const s = book.stages[stage] || {};
    const phases = Object.keys(s).filter((k) => k.startsWith("timing_s/") && k !== "timing_s/step").map((k) => k.slice(9));
    const steps = [...new Set(phases.flatMap((p) => s["timing_s/" + p].x))].sort((a, b) => a - b).slice(-60);
    const ctx = canvas.getContext("2d");
    const W = (canvas.width = canvas.clientWidth * devicePixelRatio), H = (canvas.height = canvas.clientHeight * devicePixelRatio);
    ctx.clearRect(0, 0, W, H);
    const val = (p, step) => {
      const e = s["timing_s/" + p];
      const i = e.x.lastIndexOf(step);
      return i >= 0 && e.y[i] !== null ? e.y[i] : 0;
    };
    const totals = steps.map((st) => phases.reduce((a, p) => a + val(p, st), 0));
    const max = Math.max(1e-9, ...totals);
    const bw = W / Math.max(steps.length, 1);
    steps.forEach((st, i) => {
      let y = H;
      for (const p of phases) {
        const v = (val(p, st) / max) * (H - 4);
        ctx.fillStyle = PHASE_COLORS[p] || "#999";
        ctx.fillRect(i * bw + 1, y - v, Math.max(1, bw - 2), v);
        y -= v;
      }
    });
    const sum = (p) => steps.reduce((a, st) => a + val(p, st), 0);
    const all = phases.reduce((a, p) => a + sum(p), 0) || 1;
    const share = (ps) => ((100 * ps.reduce((a, p) => a + (phases.includes(p) ? sum(p) : 0), 0)) / all).toFixed(0) + "%";
    legend.replaceChildren(
      ...phases.map((p) => h("span", {}, h("i", { style: `background:${PHASE_COLORS[p] || "#999"}` }), p)),
      h("span", { class: "muted", id: "shares" },
        `generation ${share(["gen", "gen_wait"])} · update ${share(["update_critic", "update_actor"])} · weight sync ${share(["weight_sync"])}`));
  }

  // ---- the job page ----
  async function jobPage(app, id) {
    $("#where").textContent = id;
    const snap = await api(`/api/jobs/${encodeURIComponent(id)}/snapshot?points=1500`);
    let job = snap.job;
    const book = new SeriesBook();
    book.load(snap.series);
    const els = {
      head: h("div", { class: "card", id: "head" }),
      placement: h("div", { class: "nodes", id: "placement" }),
      anatomy: h("canvas", { class: "anatomy", id: "anatomy" }),
      legend: h("div", { class: "legend" }),
      charts: h("div", { class: "charts", id: "charts" }),
      stage: h("select", { id: "stage" }),
      add: h("select", { id: "add-chart" }),
      events: h("tbody"),
      samples: h("tbody"),
      config: h("pre", { class: "config", id: "config" }, job.resolved_config || ""),
      message: h("div", { class: "error", id: "message" }),
    };
    app.replaceChildren(
      els.head,
      h("div", { class: "card" }, h("h2", {}, "Placement"), els.placement),
      h("div", { class: "card" }, h("h2", {}, "Step anatomy"), els.anatomy, els.legend),
      h("div", { class: "card" },
        h("div", { class: "row" }, h("h2", {}, "Metrics"), h("span", { class: "grow" }), "stage ", els.stage, " add chart ", els.add),
        els.charts),
      h("div", { class: "card" }, h("h2", {}, "Events"), h("div", { class: "events" }, h("table", { id: "events" }, els.events))),
      h("div", { class: "card" }, h("h2", {}, "Evaluation samples"), h("table", { id: "samples" },
        h("thead", {}, h("tr", {}, ["Step", "Prompt", "Response", "Score"].map((t) => h("th", {}, t)))), els.samples)),
      h("div", { class: "card" }, h("h2", {}, "Resolved config"), els.config));

    const grid = new ChartGrid(els.charts, book);
    const stages = () => Object.keys(book.stages);
    const pickStage = () => {
      const have = stages();
      const cur = els.stage.value;
      els.stage.replaceChildren(...have.map((s) => h("option", { value: s }, s)));
      els.stage.value = have.includes(cur) ? cur : have.includes(job.stage) ? job.stage : have[have.length - 1] || "";
      return els.stage.value;
    };
    const fillAdd = () => {
      const keys = Object.keys(book.stages[grid.stage] || {}).sort();
      els.add.replaceChildren(h("option", { value: "" }, "…"), ...keys.map((k) => h("option", { value: k }, k)));
    };
    els.stage.addEventListener("change", () => { grid.reset(els.stage.value); fillAdd(); redrawAnatomy(); });
    els.add.addEventListener("change", () => {
      if (els.add.value && !grid.extra.includes(els.add.value)) grid.extra.push(els.add.value);
      els.add.value = "";
      grid.render();
    });
    const redrawAnatomy = () => drawAnatomy(els.anatomy, els.legend, book, grid.stage);

    const renderHead = () => {
      const s = stateOf(job);
      const can = {
        pause: ["running", "preparing"].includes(s),
        resume: s === "paused" || (s === "lost" && job.resumable),
        checkpoint: ["running", "paused"].includes(s),
        cancel: !isFinal(s),
      };
      const act = (what) => async () => {
        els.message.textContent = "";
        try {
          job = await post(`/api/jobs/${encodeURIComponent(id)}/${what}`);
          renderHead();
        } catch (e) {
          els.message.textContent = `${what}: ${e.message}`;
        }
      };
      const m = job.last_metrics || {};
      els.head.replaceChildren(
        h("div", { class: "row" },
          h("h2", {}, job.name || job.id), badge(s), h("span", { class: "muted" }, job.id), h("span", { class: "grow" }),
          ...["pause", "resume", "checkpoint", "cancel"].map((w) => h("button", { id: `do-${w}`, disabled: !can[w], onclick: act(w) }, w))),
        els.message,
        h("div", { class: "row" },
          h("dl", { class: "kv" },
            h("dt", {}, "stage"), h("dd", {}, `${job.stage || "–"} (${(job.stages || []).join(" → ")})`),
            h("dt", {}, "progress"), h("dd", {}, h("div", { class: "row" }, progress(job), `${num(job.iteration)} / ${num(job.total)}`, job.phase ? h("span", { class: "muted" }, job.phase) : null)),
            h("dt", {}, "ETA"), h("dd", {}, isFinal(s) ? "–" : fmtDuration(job.eta_s)),
            h("dt", {}, "started"), h("dd", {}, fmtTime(job.start_time_us))),
          h("dl", { class: "kv" },
            h("dt", {}, "score"), h("dd", {}, fmtNum(score(m))),
            h("dt", {}, "KL"), h("dd", {}, fmtNum(m["actor/ppo_kl"])),
            h("dt", {}, "weights"), h("dd", {}, Object.entries(job.weight_versions || {}).map(([r, v]) => `${r} v${v}`).join(", ") || "–"),
            h("dt", {}, "run dir"), h("dd", {}, h("code", {}, job.run_dir || "–"))),
          job.error ? h("div", { class: "error" }, job.error) : null));
    };

    // Placement: node -> process -> role ranks (pid, memory, weight version).
    let procs = [];
    const renderPlacement = () => {
      // node name ("" = the controller's machine) -> process key -> ranks
      const byNode = new Map();
      // The current stage's ranks (each stage starts its own).
      const all = job.roles || [];
      const ranks = all.some((r) => r.stage === job.stage) ? all.filter((r) => r.stage === job.stage) : all;
      for (const r of ranks) {
        const n = r.node || "";
        if (!byNode.has(n)) byNode.set(n, new Map());
        const procsHere = byNode.get(n);
        const key = `${r.process}|${r.pid}`;
        if (!procsHere.has(key)) procsHere.set(key, { process: r.process, pid: num(r.pid), ranks: [] });
        procsHere.get(key).ranks.push(r);
      }
      const local = procs.length ? procs[0].node : "this machine";
      const mem = new Map(procs.filter((p) => p.node === local).map((p) => [num(p.pid), p]));
      const nodes = [...byNode.entries()].map(([name, procsHere]) =>
        h("div", { class: "node" }, h("div", { class: "name" }, name || local),
          h("div", { class: "procs" }, [...procsHere.values()].map((p) => {
            const info = name ? null : mem.get(p.pid);
            return h("div", { class: "proc" },
              h("div", {}, h("b", {}, p.process), ` pid ${p.pid}`),
              h("div", { class: "muted" }, info ? (info.alive ? fmtBytes(info.rss_bytes) : "exited") : name ? "on node " + name : "–"),
              h("div", {}, p.ranks.map((r) => {
                const v = (job.weight_versions || {})[r.role];
                const restarts = num(r.attempt || 0);
                return h("span", {
                  class : `rank ${
                      r.status === "failed"       ? "failed"
                      : r.status === "restarting" ? "restarting"
                                                  : ""}`,
                  title : r.reason || r.status
                },
                         `${r.role}:${r.rank} ${r.status}${restarts ? ` ×${restarts}` : ""}${
                             v !== undefined ? ` v${v}` : ""}`);
              })));
          }))));
      els.placement.replaceChildren(...nodes);
    };
    const loadProcs = async () => {
      try {
        procs = (await api(`/api/jobs/${encodeURIComponent(id)}/processes`)).processes || [];
        renderPlacement();
      } catch (e) { /* shown by the connection dot */ }
    };

    const EVENT_ROWS = 400;
    const addEvent = (e) => {
      if (e.kind === "metrics") return;
      const bad = (e.kind === "state" && (e.to === "failed")) || (e.kind === "role" && e.status === "failed") || (e.kind === "log" && e.level === "error");
      const warn = (e.kind === "log" && e.level === "warning") ||
                   (e.kind === "role" && (e.status === "restarting" || e.status === "restarted"));
      const { seq, time_us, kind, ...rest } = e;
      const text = kind === "log" ? rest.text : Object.entries(rest).filter(([, v]) => v !== "" && v !== 0 && typeof v !== "object").map(([k, v]) => `${k}=${v}`).join(" ");
      els.events.prepend(h("tr", { class: bad ? "bad" : warn ? "warn" : "", "data-kind": kind },
        h("td", { class: "muted" }, seq), h("td", { class: "muted" }, new Date(num(time_us) / 1000).toLocaleTimeString()), h("td", {}, kind), h("td", {}, text)));
      while (els.events.rows.length > EVENT_ROWS) els.events.deleteRow(-1);
    };
    // An episode's conversation (docs/agents.md): each message with its
    // role and the turn it belongs to; the model's turns stand out.
    const conversation = (text) => {
      let msgs;
      try {
        msgs = JSON.parse(text);
      } catch (err) {
        return null;
      }
      if (!Array.isArray(msgs))
        return null;
      return h("div", {class : "conversation"},
               msgs.map((m) => h("div", {
                          class : "msg role-" + String(m.role || "?").replace(/[^a-z]/g, ""),
                          "data-turn" : m.turn === undefined ? "" : String(m.turn)
                        },
                                 h("span", {class : "msg-tag"},
                                   (m.turn === undefined ? "" : "turn " + m.turn + " · ") +
                                       String(m.role || "?")),
                                 h("code", {}, String(m.content ?? "")))));
    };
    const addSamples = (e) => {
      for (const smp of e.samples || []) {
        const talk = smp.conversation ? conversation(smp.conversation) : null;
        const response = talk || h("code", {}, smp.response);
        els.samples.prepend(h("tr", {}, h("td", {}, e.step), h("td", {}, h("code", {}, smp.prompt)),
                              h("td", {}, response), h("td", {}, fmtNum(smp.score))));
      }
      while (els.samples.rows.length > 60)
        els.samples.deleteRow(-1);
    };

    renderHead();
    renderPlacement();
    grid.stage = pickStage();
    grid.render();
    fillAdd();
    redrawAnatomy();
    for (const e of snap.events) addEvent(e);
    for (const e of snap.samples) addSamples(e);
    loadProcs();
    const procTimer = setInterval(loadProcs, 5000);

    // Live: the job's event stream from the snapshot's end; EventSource
    // reconnects by itself and sends Last-Event-ID, so nothing is missed.
    let dirty = false, headDirty = false;
    const es = new EventSource(`/api/jobs/${encodeURIComponent(id)}/events?from=${num(snap.last_seq) + 1}`);
    es.onopen = () => setLive(true);
    es.onerror = () => setLive(false);
    const refreshJob = async () => {
      try {
        job = await api(`/api/jobs/${encodeURIComponent(id)}`);
        renderHead();
        renderPlacement();
      } catch (e) { /* retried on the next event */ }
    };
    es.addEventListener("event", (msg) => {
      const e = JSON.parse(msg.data);
      if (e.kind === "metrics") {
        book.add(e.stage, num(e.step), e.metrics);
        dirty = true;
      } else {
        addEvent(e);
        if (e.kind === "eval_samples") addSamples(e);
      }
      headDirty = true;
    });
    es.addEventListener("end", (msg) => {
      job = JSON.parse(msg.data);
      es.close();
      clearInterval(procTimer);
      renderHead();
      renderPlacement();
      dirty = true;
    });
    const tick = setInterval(() => {
      if (dirty) {
        dirty = false;
        if (!grid.stage || !stages().includes(grid.stage) || (job.stage && job.stage !== grid.stage && stages().includes(job.stage) && els.stage.dataset.user !== "1")) {
          grid.reset(pickStage());
          fillAdd();
        } else grid.render();
        redrawAnatomy();
      }
      if (headDirty) {
        headDirty = false;
        refreshJob();
      }
    }, 500);
    els.stage.addEventListener("change", () => (els.stage.dataset.user = "1"));
    window.addEventListener("pagehide", () => { es.close(); clearInterval(tick); clearInterval(procTimer); });
    document.body.dataset.ready = "1";
  }

  async function main() {
    const app = $("#app");
    try {
      const s = await api("/api/session");
      csrf = s.csrf;
      $("#logout-csrf").value = csrf;
      const m = location.pathname.match(/^\/jobs\/([^/]+)$/);
      if (m) await jobPage(app, decodeURIComponent(m[1]));
      else await jobsPage(app);
      document.body.dataset.ready = "1";
      window.troupeReadyMs = performance.now(); // read by bench/bench_dashboard.py
    } catch (e) {
      app.replaceChildren(h("div", { class: "card error" }, e.message));
    }
  }
  document.addEventListener("DOMContentLoaded", main);
})();
