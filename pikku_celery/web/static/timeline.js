// The run's timeline: one row per step, its attempts on a shared time axis.
//
// A task step's attempt is two bars: the wait for a worker (its message sent
// -> the claim) and the attempt itself (claim -> outcome, or now while it
// runs), styled by how it ended: succeeded, failed, superseded (its lease
// lapsed and the next attempt took over), cancelled, lease expired; a tick
// marks its last lease renewal (when its worker was last heard of). A retry
// waiting for its delay, a durable timer (a sleep until its wake_at), a wait
// for a signal or a child run are bars of their own. An operator's action
// (cancel, retry, signal) is a marked line across the rows at its time. Times
// are the store's clock (the JSON's "now"), never the browser's.

import { svg, ms, duration, clock } from "./format.js";

const WIDTH = 1000;
const LABEL = 190;
const ROW = 28;
const BAR = 16;
const AXIS = 26;
const MIN_SPAN_MS = 50;

export function drawTimeline(data, { selected, onSelect }) {
  const run = data.run;
  const now = ms(data.now);
  const live = !["completed", "failed", "cancelled"].includes(run.status);
  const t0 = ms(run.created_at);
  let t1 = live ? now : ms(run.updated_at);
  for (const step of data.steps) {
    t1 = Math.max(t1, ms(step.updated_at));
    for (const a of step.attempts) t1 = Math.max(t1, ms(a.finished_at) || 0);
  }
  for (const entry of data.audit || []) t1 = Math.max(t1, ms(entry.at));
  t1 = Math.max(t1, t0 + MIN_SPAN_MS); // a run of a few ms still gets a readable axis
  const span = t1 - t0;
  const plot = WIDTH - LABEL - 12;
  const x = (t) => LABEL + (Math.min(Math.max(t, t0), t1) - t0) / span * plot;
  const height = AXIS + Math.max(data.steps.length, 1) * ROW + 8;

  const root = svg("svg", {
    id: "timeline-svg",
    viewBox: `0 0 ${WIDTH} ${height}`,
    width: "100%",
    role: "img",
    "aria-label": "timeline of the run's steps and attempts",
  });
  root.append(defs());
  root.append(axis(t0, span, plot, height, x, live ? now : null));

  if (!data.steps.length) {
    root.append(svg("text", { x: LABEL, y: AXIS + 18, class: "empty", text: "no steps recorded yet" }));
  }
  data.steps.forEach((step, i) => {
    const y = AXIS + i * ROW + (ROW - BAR) / 2;
    const row = svg("g", {
      class: `step kind-${step.kind}`,
      dataset: { step: step.name, kind: step.kind, status: step.status },
    });
    row.append(svg("rect", { class: `row-band ${i % 2 ? "odd" : "even"}`, x: 0, y: AXIS + i * ROW, width: WIDTH, height: ROW }));
    const label = step.name.length > 26 ? step.name.slice(0, 25) + "…" : step.name;
    row.append(
      svg("text", { class: "step-label", x: 8, y: y + BAR - 3 }, label, svg("title", { text: `${step.name} (${step.kind}, ${step.status})` })),
    );
    const bars = step.kind === "task" ? taskBars(step, now, x, y, selected, onSelect) : otherBars(step, now, x, y, t1, selected, onSelect);
    row.append(...bars);
    root.append(row);
  });
  for (const entry of data.audit || []) root.append(actionMark(entry, x, height));
  return root;
}

// An operator's action at its time: a line across the rows, its name on top.
function actionMark(entry, x, height) {
  const px = x(ms(entry.at));
  const who = `${entry.action} by ${entry.actor}${entry.origin ? ` from ${entry.origin}` : ""} at ${clock(entry.at)}`;
  return svg(
    "g",
    { class: `action-mark action-${entry.action}`, dataset: { action: entry.action } },
    svg("line", { x1: px, y1: AXIS - 2, x2: px, y2: height, class: "action-line" }),
    svg("text", { x: px + 3, y: AXIS + 9, class: "action-label", text: entry.action }),
    svg("title", { text: who }),
  );
}

function defs() {
  return svg(
    "defs",
    {},
    svg(
      "pattern",
      { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
      svg("rect", { width: 6, height: 6, class: "hatch-bg" }),
      svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "hatch-line" }),
    ),
    svg(
      "pattern",
      { id: "hatch-superseded", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(-45)" },
      svg("rect", { width: 6, height: 6, class: "superseded-bg" }),
      svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, class: "superseded-line" }),
    ),
  );
}

function axis(t0, span, plot, height, x, now) {
  const g = svg("g", { class: "axis" });
  for (let i = 0; i <= 4; i++) {
    const t = t0 + (span * i) / 4;
    const px = x(t);
    g.append(svg("line", { x1: px, y1: AXIS - 4, x2: px, y2: height, class: "tick" }));
    g.append(svg("text", { x: px, y: AXIS - 9, class: `tick-label ${i === 4 ? "end" : i === 0 ? "start" : ""}`, text: `+${duration((t - t0) / 1000)}` }));
  }
  if (now !== null) {
    g.append(svg("line", { x1: x(now), y1: AXIS - 4, x2: x(now), y2: height, class: "now-line" }, svg("title", { text: "now (the store's clock)" })));
  }
  return g;
}

function bar(cls, from, to, x, y, title, extra = {}) {
  const left = x(from);
  const width = Math.max(x(to) - left, 2);
  return svg("rect", { class: cls, x: left, y, width, height: BAR, rx: 2, ...extra }, svg("title", { text: title }));
}

function selectable(node, key, selected, onSelect) {
  node.setAttribute("tabindex", "0");
  node.setAttribute("role", "button");
  if (key === selected) node.classList.add("selected");
  node.addEventListener("click", () => onSelect(key));
  node.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      onSelect(key);
    }
  });
  return node;
}

function taskBars(step, now, x, y, selected, onSelect) {
  const out = [];
  step.attempts.forEach((a, i) => {
    const next = step.attempts[i + 1];
    const start = ms(a.started_at);
    const end = ms(a.finished_at) ?? (a.status === "running" ? now : next ? ms(next.started_at) : start);
    const g = svg("g", {
      class: `attempt status-${a.status}`,
      dataset: { step: step.name, attempt: a.attempt, status: a.status, renewals: a.renewals ?? 0 },
    });
    const queued = ms(a.queued_at);
    if (queued !== null && queued < start) {
      g.append(bar("wait", queued, start, x, y, `attempt ${a.attempt}: waited ${duration((start - queued) / 1000)} for a worker`));
    }
    const who = (a.node || a.worker ? ` on ${a.node ?? a.worker}` : "") + (a.dispatch ? ` (${a.dispatch})` : "");
    g.append(
      bar("run", start, end, x, y, `attempt ${a.attempt} of ${step.max_attempts}: ${a.status}${who}, ${duration(a.duration_s)}`),
    );
    const renewed = ms(a.renewed_at);
    if (renewed !== null) {
      const px = x(renewed);
      const times = a.renewals === 1 ? "1 lease renewal" : `${a.renewals} lease renewals`;
      g.append(svg("line", { class: "renewal", x1: px, y1: y - 2, x2: px, y2: y + BAR + 2 }, svg("title", { text: `attempt ${a.attempt}: ${times}, the last at ${a.renewed_at}` })));
    }
    const width = x(end) - x(start);
    if (width > 26) {
      g.append(svg("text", { class: "bar-label", x: x(start) + 4, y: y + BAR - 4, text: `#${a.attempt}` }));
    }
    out.push(selectable(g, `${step.id}:${a.attempt}`, selected, onSelect));
  });
  const last = step.attempts[step.attempts.length - 1];
  const waiting = step.status === "pending" || step.status === "scheduled";
  if (waiting) {
    const since = last ? ms(last.finished_at) ?? ms(last.started_at) : ms(step.created_at);
    out.push(bar("wait waiting", since, now, x, y, `waiting for a worker since ${duration((now - since) / 1000)} ago (queue ${step.queue ?? "default"})`, { "data-waiting": "1" }));
  }
  if (step.status === "failed" && step.wake_at && last) {
    const from = ms(last.finished_at) ?? ms(last.started_at);
    out.push(bar("retry-wait", from, ms(step.wake_at), x, y, `retry ${step.attempt + 1} of ${step.max_attempts} due at ${step.wake_at}`));
  }
  return out;
}

function otherBars(step, now, x, y, t1, selected, onSelect) {
  const from = ms(step.created_at);
  const settled = step.status === "succeeded" || step.status === "failed";
  const end = settled ? ms(step.updated_at) : now;
  const g = svg("g", { class: `wait-step status-${step.status}`, dataset: { step: step.name, kind: step.kind } });
  if (step.kind === "value") {
    g.append(svg("circle", { class: "value-dot", cx: x(from), cy: y + BAR / 2, r: 4 }, svg("title", { text: `recorded value at ${step.created_at}` })));
  } else if (step.kind === "sleep") {
    const due = ms(step.wake_at) ?? end;
    const left = settled ? `slept until ${step.wake_at}` : `sleeps until ${step.wake_at} (in ${duration((due - now) / 1000)})`;
    g.append(bar(`timer ${settled ? "fired" : "pending"}`, from, settled ? end : Math.min(due, t1), x, y, `durable timer: ${left}`));
  } else if (step.kind === "signal") {
    const timeout = step.wake_at ? `, times out at ${step.wake_at}` : ", no timeout";
    g.append(bar(`signal-wait status-${step.status}`, from, end, x, y, `waits for ${step.name}${timeout}: ${step.status}`));
    if (step.wake_at && !settled) {
      const px = x(ms(step.wake_at));
      g.append(svg("line", { class: "deadline", x1: px, y1: y - 2, x2: px, y2: y + BAR + 2 }, svg("title", { text: `timeout at ${step.wake_at}` })));
    }
  } else {
    const child = step.child_run_id ? ` run ${step.child_run_id}` : "";
    g.append(bar(`child-wait status-${step.status}`, from, end, x, y, `child${child}: ${step.status}`));
  }
  return [selectable(g, `${step.id}:`, selected, onSelect)];
}
