// The run page: the runs list, or (with ?run=<id>) one run's view, drawn from
// the JSON API. A live run is polled every second until it settles, the list
// every few seconds; nothing reloads the page. Actions (cancel, retry, signal)
// appear only when the API says this request may do them, and each asks for
// a confirmation first.

import { el, clock, duration, json, errorLine, errorBlock, badge, bounded, waitingText } from "./format.js";
import { drawTimeline } from "./timeline.js";

const API = document.body.dataset.api;
const CSRF = document.body.dataset.csrf || "";
const RUN_POLL_MS = 1000;
const LIST_POLL_MS = 3000;
const STATUSES = ["running", "suspended", "completed", "failed", "cancelled", "queued"];
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const FILTERS = ["status", "workflow", "since", "until", "q", "offset", "before"];

const main = document.getElementById("main");
const live = document.getElementById("live");
const notice = document.getElementById("notice");

let generation = 0; // bumped on every navigation: stale polls stop themselves
let pending = null;

class ApiFailure extends Error {
  constructor(status, body) {
    super(body && body.message ? body.message : `HTTP ${status}`);
    this.status = status;
    this.code = body && body.error;
  }
}

async function call(path, options = {}) {
  const response = await fetch(API + path, {
    cache: "no-store",
    credentials: "same-origin",
    ...options,
    headers: { Accept: "application/json", ...(options.headers || {}) },
  });
  let body = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (!response.ok) throw new ApiFailure(response.status, body);
  return body;
}

function post(path, payload) {
  const headers = { "Content-Type": "application/json" };
  if (CSRF) headers["X-CSRFToken"] = CSRF;
  return call(path, { method: "POST", headers, body: JSON.stringify(payload) });
}

function schedule(fn, delay, gen) {
  clearTimeout(pending);
  pending = setTimeout(() => {
    if (gen === generation) fn();
  }, delay);
}

function setLive(text, on) {
  live.textContent = text;
  live.classList.toggle("on", on);
}

function say(text, kind = "ok") {
  notice.textContent = text;
  notice.className = `notice ${kind}`;
  notice.hidden = false;
}

function navigate(search) {
  history.pushState(null, "", search || location.pathname);
  route();
}

function link(search, text, attrs = {}) {
  return el("a", {
    href: search,
    onclick: (event) => {
      if (event.metaKey || event.ctrlKey || event.shiftKey || event.button !== 0) return;
      event.preventDefault();
      navigate(search);
    },
    ...attrs,
    text,
  });
}

function route() {
  generation += 1;
  clearTimeout(pending);
  notice.hidden = true;
  const params = new URLSearchParams(location.search);
  const run = params.get("run");
  if (run) showRun(run, generation);
  else showList(params, generation);
}

window.addEventListener("popstate", route);

function failure(error, what) {
  const status = error instanceof ApiFailure ? error.status : null;
  const text = status === 403 ? `You may not see ${what}: ${error.message}` : error.message;
  return el("div", { class: "failure", id: "failure", dataset: { status: status ?? "" } }, el("p", { text }), link("?", "back to the runs"));
}

// --- the runs list -----------------------------------------------------------

function showList(params, gen) {
  const filters = {};
  for (const key of FILTERS) if (params.get(key)) filters[key] = params.get(key);
  document.title = "runs · pikku-celery";
  const form = filterForm(filters);
  const counts = el("nav", { id: "counts", "aria-label": "runs by status" });
  const table = el("div", { id: "runs-table" }, el("p", { class: "loading", text: "loading runs…" }));
  main.replaceChildren(el("section", { id: "list" }, form, counts, table));

  const refresh = async () => {
    try {
      const page = await call("runs?" + new URLSearchParams(filters));
      if (gen !== generation) return;
      counts.replaceChildren(...countLinks(page.counts, filters, page.counts_capped ? page.count_cap : null));
      table.replaceChildren(runsTable(page), pager(page, filters));
      setLive(`updated ${clock(page.now)}`, true);
    } catch (error) {
      if (gen !== generation) return;
      table.replaceChildren(failure(error, "the runs"));
      setLive("not updating", false);
      if (error instanceof ApiFailure && error.status < 500) return;
    }
    schedule(refresh, LIST_POLL_MS, gen);
  };
  refresh();
}

function query(filters, changes = {}) {
  const next = { ...filters, ...changes };
  const params = new URLSearchParams();
  for (const key of FILTERS) if (next[key] !== undefined && next[key] !== null && next[key] !== "") params.set(key, next[key]);
  const text = params.toString();
  return text ? `?${text}` : "?";
}

function filterForm(filters) {
  const status = el("select", { name: "status", id: "filter-status" }, el("option", { value: "", text: "any status" }), STATUSES.map((s) => el("option", { value: s, text: s, selected: filters.status === s })));
  const input = (name, label, placeholder) =>
    el("label", {}, label, el("input", { name, id: `filter-${name}`, value: filters[name] || "", placeholder, autocomplete: "off", spellcheck: "false" }));
  const form = el(
    "form",
    { id: "filters", class: "filters" },
    el("label", {}, "Status", status),
    input("workflow", "Workflow", "registered name"),
    input("since", "Created since", "1h, 2024-05-01T12:00 or epoch ms"),
    input("until", "Created before", "30m, 2024-05-02 or epoch ms"),
    input("q", "Run id or idempotency key", "exactly as stored"),
    el("div", { class: "buttons" }, el("button", { type: "submit", text: "Filter" }), link("?", "clear", { class: "clear" })),
  );
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const chosen = {};
    for (const [key, value] of data.entries()) {
      const text = key === "q" ? String(value) : String(value).trim(); // keys compare exactly
      if (text.trim()) chosen[key] = text;
    }
    navigate(query(chosen));
  });
  return form;
}

// A count that reached the cap reads "10,000+" (the server stops counting there).
function countText(n, cap, total) {
  if (cap === null) return String(n);
  return total || n >= cap ? `${n.toLocaleString("en")}+` : String(n);
}

function countLinks(counts, filters, cap) {
  const all = link(query(filters, { status: "", offset: "", before: "" }), "", { class: `count ${filters.status ? "" : "current"}`, dataset: { status: "all" } });
  all.append(el("span", { class: "label", text: "all" }), el("span", { class: "n", text: countText(counts.total, cap, true) }));
  return [
    all,
    ...STATUSES.map((s) => {
      const a = link(query(filters, { status: s, offset: "", before: "" }), "", { class: `count status-${s} ${filters.status === s ? "current" : ""}`, dataset: { status: s } });
      a.append(el("span", { class: "label", text: s }), el("span", { class: "n", text: countText(counts[s], cap, false) }));
      return a;
    }),
  ];
}

function runsTable(page) {
  if (!page.runs.length) return el("p", { class: "empty", id: "no-runs", text: "no runs match" });
  const head = el("tr", {}, ["run", "workflow", "version", "status", "created (UTC)", "duration", "idempotency key", "error"].map((h) => el("th", { text: h })));
  const rows = page.runs.map((r) =>
    el(
      "tr",
      { dataset: { runId: r.id, status: r.status } },
      el("td", { class: "mono" }, link(`?run=${encodeURIComponent(r.id)}`, r.id)),
      el("td", { text: r.workflow }),
      el("td", { class: "mono version", text: r.workflow_version ?? "" }),
      el(
        "td",
        {},
        badge(r.status),
        r.cancel_requested && !TERMINAL.has(r.status) ? el("span", { class: "hint", text: " cancelling" }) : null,
        r.blocked ? el("span", { class: "hint bad", text: " blocked", title: r.blocked }) : null,
        r.waiting ? el("div", { class: `waiting waiting-${r.waiting.for}`, dataset: { waiting: r.waiting.for }, text: waitingText(r.waiting) }) : null,
      ),
      el("td", { class: "mono", text: clock(r.created_at) }),
      el("td", { class: "num", text: duration(r.duration_s) }),
      el("td", { class: "mono", text: r.idempotency_key ?? "" }),
      el("td", { class: "err", text: r.error ?? r.blocked ?? "" }),
    ),
  );
  return el("table", { id: "runs", class: "grid" }, el("thead", {}, head), el("tbody", {}, rows));
}

// Older pages go by cursor (a deep page costs what the first does); the way
// back is the browser's, or the newest page.
function pager(page, filters) {
  const nav = el("nav", { class: "pager" });
  if (page.before) nav.append(link(query(filters, { before: "", offset: "" }), "← newest"));
  else if (page.offset > 0) nav.append(link(query(filters, { offset: Math.max(0, page.offset - page.limit) || "" }), "← newer"));
  const first = page.before ? "older runs" : `runs ${page.runs.length ? page.offset + 1 : 0}–${page.offset + page.runs.length}`;
  nav.append(el("span", { text: ` ${first} ` }));
  if (page.has_more) nav.append(link(query(filters, { before: page.next_cursor, offset: "" }), "older →"));
  return nav;
}

// --- one run -----------------------------------------------------------------

function showRun(id, gen) {
  document.title = `run ${id} · pikku-celery`;
  main.replaceChildren(el("p", { class: "loading", text: `loading run ${id}…` }));
  // wanted: how many steps the page shows (the API's first page, then more
  // a page at a time on "show more steps"); each poll reads those pages again.
  const view = { id, selected: null, data: null, gen, wanted: 0 };
  const refresh = async () => {
    clearTimeout(pending);
    try {
      const data = await readRun(id, view.wanted);
      if (gen !== generation) return;
      view.data = data;
      renderRun(view);
      if (TERMINAL.has(data.run.status)) {
        setLive(`${data.run.status}: not updating`, false);
        return;
      }
      setLive(`live · updated ${clock(data.now)}`, true);
    } catch (error) {
      if (gen !== generation) return;
      if (error instanceof ApiFailure && error.status < 500) {
        main.replaceChildren(failure(error, "this run"));
        setLive("not updating", false);
        return;
      }
      setLive(`update failed (${error.message}); retrying`, false);
    }
    schedule(refresh, RUN_POLL_MS, gen);
  };
  view.refresh = refresh;
  view.more = () => {
    view.wanted = view.data.steps.length + view.data.steps_limit;
    refresh();
  };
  refresh();
}

// The run with its first page of steps, and the pages after it until at
// least `wanted` steps are read (or none remain): a long history is never
// read whole, and its pages arrive in seq order.
async function readRun(id, wanted) {
  const path = `runs/${encodeURIComponent(id)}`;
  const data = await call(path);
  const steps = [...data.steps];
  let next = data.next_steps;
  while (next !== null && next !== undefined && steps.length < wanted) {
    const page = await call(`${path}?steps_after=${next}&steps_limit=${data.steps_limit}`);
    steps.push(...page.steps);
    next = page.next_steps;
  }
  return { ...data, steps, next_steps: next };
}

function renderRun(view) {
  const data = view.data;
  const select = (key) => {
    view.selected = view.selected === key ? null : key;
    renderRun(view);
  };
  const timeline = el(
    "section",
    { id: "timeline", class: "panel" },
    el("h2", { text: "Timeline" }),
    drawTimeline(data, { selected: view.selected, onSelect: select }),
    legend(),
  );
  main.replaceChildren(
    el("section", { id: "run" }, runHeader(data), actions(view), eventsPanel(data), canvasTree(data), timeline, detail(data, view.selected), stepsTable(data, select, view.more), auditTrail(data), extras(data)),
  );
}

function runHeader(data) {
  const run = data.run;
  const facts = [
    ["run", el("span", { class: "mono", id: "run-id", text: run.id })],
    ["version", run.workflow_version ? el("span", { class: "mono", id: "run-version", text: run.workflow_version }) : null],
    ["idempotency key", run.idempotency_key ? el("span", { class: "mono", text: run.idempotency_key }) : null],
    ["created", clock(run.created_at)],
    ["updated", clock(run.updated_at)],
    ["duration", duration(run.duration_s)],
    ["parent run", run.parent_run_id ? link(`?run=${run.parent_run_id}`, run.parent_run_id, { class: "mono", id: "parent-link" }) : null],
    ["continued from", run.continued_from ? link(`?run=${run.continued_from}`, run.continued_from, { class: "mono", id: "continued-from-link" }) : null],
    ["continued as", run.continued_as ? link(`?run=${run.continued_as}`, run.continued_as, { class: "mono", id: "continued-as-link" }) : null],
    ["children", data.children.length ? el("span", { id: "children" }, data.children.map((c) => link(`?run=${c}`, c, { class: "mono child-link" }))) : null],
    ["waiting", data.waiting ? el("span", { id: "run-waiting", text: waitingText(data.waiting) }) : null],
    ["next wake-up", run.wake_at && !TERMINAL.has(run.status) ? clock(run.wake_at) : null],
    ["deadline", run.deadline_at ? clock(run.deadline_at) : null],
    ["blocked", run.blocked ? el("span", { class: "bad", text: run.blocked }) : null],
    ["kept", data.retention ? el("span", { id: "run-retention", text: data.retention }) : null],
  ];
  const dl = el("dl", { class: "facts" });
  for (const [key, value] of facts) if (value) dl.append(el("dt", { text: key }), el("dd", {}, value));
  const outcome =
    run.status === "completed"
      ? el("div", { class: "io" }, el("h3", { text: "Output" }), el("pre", { id: "run-output", text: json(run.output) }))
      : run.error
        ? el("div", { class: "io", id: "run-error" }, el("h3", { text: "Error" }), errorBlock(run.error))
        : null;
  return el(
    "header",
    { id: "run-header", class: "panel" },
    el(
      "h1",
      {},
      link("?", "runs", { class: "crumb" }),
      " / ",
      el("span", { id: "run-workflow", text: run.workflow }),
      " ",
      el("span", { id: "run-status", class: `badge big status-${run.status}`, text: run.status }),
      run.cancel_requested && !TERMINAL.has(run.status) ? el("span", { class: "hint", id: "cancelling", text: " cancel requested" }) : null,
    ),
    dl,
    el("div", { class: "io-row" }, el("div", { class: "io" }, el("h3", { text: "Input" }), el("pre", { id: "run-input", text: json(run.input) })), outcome),
  );
}

function actions(view) {
  const allowed = view.data.actions;
  const bar = el("div", { id: "actions", class: "actions" });
  const labels = { cancel: "Cancel run…", retry: "Retry failed steps…", signal: "Send signal…" };
  for (const action of ["cancel", "retry", "signal"]) {
    if (allowed[action]) bar.append(el("button", { type: "button", id: `action-${action}`, class: action === "cancel" ? "danger" : "", text: labels[action], onclick: () => confirmAction(action, view) }));
  }
  return bar.childElementCount ? bar : null;
}

const CONFIRM = {
  cancel: ["Cancel this run?", "The run and its children end as cancelled at their next pass; steps still running finish, but their results are refused.", "Yes, cancel the run"],
  retry: ["Retry this run?", "Its failed steps get fresh attempts; the steps that succeeded keep their results.", "Yes, retry"],
  signal: ["Send a signal", "The first signal of a name wins; the run's next pass sees it.", "Send the signal"],
};

function confirmAction(action, view) {
  const dialog = document.getElementById("confirm");
  const [title, text, yes] = CONFIRM[action];
  dialog.querySelector("#confirm-title").textContent = title;
  dialog.querySelector("#confirm-text").textContent = text;
  dialog.querySelector("#signal-fields").hidden = action !== "signal";
  const problem = dialog.querySelector("#confirm-error");
  problem.hidden = true;
  const yesButton = dialog.querySelector("#confirm-yes");
  const noButton = dialog.querySelector("#confirm-no");
  yesButton.textContent = yes;
  yesButton.disabled = false;
  const close = () => dialog.close();
  noButton.onclick = close;
  yesButton.onclick = async () => {
    let path = `runs/${encodeURIComponent(view.id)}/${action}`;
    let payload = {};
    if (action === "signal") {
      const name = dialog.querySelector("#signal-name").value;
      try {
        payload = JSON.parse(dialog.querySelector("#signal-payload").value || "null");
      } catch (error) {
        problem.textContent = `The payload is not JSON: ${error.message}`;
        problem.hidden = false;
        return;
      }
      path = `runs/${encodeURIComponent(view.id)}/signals/${encodeURIComponent(name)}`;
    }
    yesButton.disabled = true;
    try {
      const answer = await post(path, payload);
      close();
      say(action === "cancel" ? "Cancel requested: the run's next pass ends it." : action === "retry" ? "Retrying: the failed steps get fresh attempts." : "Signal sent.");
      view.data.run = { ...view.data.run, ...answer.run };
      view.refresh();
    } catch (error) {
      problem.textContent = error.message;
      problem.hidden = false;
      yesButton.disabled = false;
    }
  };
  dialog.showModal();
}

function legend() {
  const item = (cls, text) => el("span", { class: "key" }, el("span", { class: `swatch ${cls}` }), text);
  return el(
    "div",
    { class: "legend" },
    item("wait", "waiting for a worker"),
    item("status-running", "running"),
    item("status-succeeded", "succeeded"),
    item("status-failed", "failed"),
    item("status-superseded", "superseded (lease lapsed, taken over)"),
    item("status-cancelled", "cancelled / lease expired"),
    item("retry-wait", "retry delay"),
    item("timer", "durable timer"),
    item("signal-wait", "waiting for a signal or child"),
    item("renewal", "last lease renewal"),
    item("action", "operator action (cancel, retry, signal)"),
  );
}

function findStep(data, key) {
  if (!key) return [null, null];
  const [stepId, attempt] = key.split(":");
  const step = data.steps.find((s) => s.id === stepId);
  if (!step) return [null, null];
  return [step, attempt ? step.attempts.find((a) => String(a.attempt) === attempt) : null];
}

function detail(data, selected) {
  const [step, attempt] = findStep(data, selected);
  const panel = el("section", { id: "attempt-detail", class: "panel" });
  if (!step) {
    panel.append(el("p", { class: "hint", text: "Click an attempt on the timeline for its worker, times, and result or error with its traceback." }));
    return panel;
  }
  if (!attempt) {
    panel.dataset.step = step.name;
    panel.append(el("h2", {}, `Step ${step.name} `, badge(step.status)));
    const dl = el("dl", { class: "facts" });
    const facts = [["kind", step.kind], ["recorded", clock(step.created_at)], ["updated", clock(step.updated_at)], ["wake at", step.wake_at ? clock(step.wake_at) : null], ["child run", step.child_run_id ? link(`?run=${step.child_run_id}`, step.child_run_id, { class: "mono" }) : null]];
    for (const [k, v] of facts) if (v) dl.append(el("dt", { text: k }), el("dd", {}, v));
    panel.append(dl);
    panel.append(step.error ? errorBlock(step.error) : el("pre", { class: "result", text: json(step.result) }));
    return panel;
  }
  panel.dataset.step = step.name;
  panel.dataset.attempt = attempt.attempt;
  panel.append(el("h2", {}, `Step ${step.name} · attempt ${attempt.attempt} of ${step.max_attempts} `, badge(attempt.status)));
  const wait = attempt.queued_at ? (Date.parse(attempt.started_at) - Date.parse(attempt.queued_at)) / 1000 : null;
  const dl = el("dl", { class: "facts" });
  const carried = attempt.task_id_of === "carrier";
  const facts = [
    ["node", attempt.node ? el("span", { class: "mono", id: "attempt-node", text: attempt.node }) : "–"],
    [
      "celery task id",
      attempt.task_id
        ? el("span", {}, el("span", { class: "mono", id: "attempt-task-id", text: attempt.task_id }), carried ? el("span", { class: "hint", id: "attempt-carrier", text: " (the message that carried it: it ran eagerly, after the step before it)" }) : null)
        : "–",
    ],
    // the lease holder (host:pid), when the node name does not say it already
    ["worker process", attempt.worker && attempt.worker !== attempt.node ? el("span", { class: "mono", text: attempt.worker }) : null],
    ["dispatch", attempt.dispatch ?? "–"],
    ["task", step.task],
    ["args", bounded(step.args, undefined, { id: "attempt-args" })],
    ["kwargs", bounded(step.kwargs, undefined, { id: "attempt-kwargs" })],
    ["queue", step.queue ?? "(default)"],
    ["message sent", attempt.queued_at ? clock(attempt.queued_at) : "–"],
    ["queue wait", wait !== null ? duration(wait) : "–"],
    ["started", clock(attempt.started_at)],
    ["finished", attempt.finished_at ? clock(attempt.finished_at) : attempt.status === "running" ? "still running" : "never (no outcome recorded)"],
    ["ran for", duration(attempt.duration_s) + (attempt.status === "running" ? " so far" : "")],
    ["lease renewals", attempt.renewals ? `${attempt.renewals}, the last at ${clock(attempt.renewed_at)}` : "none"],
  ];
  for (const [k, v] of facts) if (v !== null) dl.append(el("dt", { text: k }), el("dd", {}, v));
  panel.append(dl);
  if (attempt.status === "superseded") {
    panel.append(el("p", { class: "hint", text: `Its lease lapsed (the worker died or stalled) and attempt ${attempt.attempt + 1} took over; a late result from it is refused.` }));
  }
  if (attempt.error) panel.append(el("h3", { text: "Error" }), errorBlock(attempt.error));
  else if (attempt.status === "succeeded") panel.append(el("h3", { text: "Result" }), el("pre", { class: "result", id: "attempt-result", text: json(attempt.result) }));
  return panel;
}

function stepsTable(data, select, more) {
  if (!data.steps.length) return null;
  const head = el("tr", {}, ["#", "step", "kind", "status", "attempt", "task / detail", "arguments", "queue", "node", "duration", "lease left", "result / error"].map((h) => el("th", { text: h })));
  const rows = data.steps.map((s) => {
    const lastAttempt = s.attempts[s.attempts.length - 1];
    const key = s.kind === "task" ? (lastAttempt ? `${s.id}:${lastAttempt.attempt}` : null) : `${s.id}:`;
    const outcome = s.error ? errorLine(s.error) : s.status === "succeeded" && s.kind !== "sleep" ? JSON.stringify(s.result) : "";
    const info = s.kind === "task" ? s.task : s.kind === "sleep" ? (s.wake_at ? `until ${clock(s.wake_at)}` : `woke ${clock(s.updated_at)}`) : s.kind === "child" ? `child ${s.child_run_id ?? ""}` : s.kind === "signal" ? (s.wake_at ? `timeout ${clock(s.wake_at)}` : "no timeout") : "";
    return el(
      "tr",
      { dataset: { step: s.name }, class: key ? "clickable" : "", onclick: key ? () => select(key) : null },
      el("td", { class: "num", text: s.seq }),
      el("td", { text: s.name }),
      el("td", { text: s.kind }),
      el("td", {}, badge(s.status), s.status === "failed" && s.wake_at ? el("span", { class: "hint", text: " retry due" }) : null),
      el("td", { class: "num", text: s.kind === "task" ? `${s.attempt}/${s.max_attempts}` : "–" }),
      el("td", { class: "mono", text: info ?? "" }),
      el("td", { class: "mono args", title: s.kind === "task" ? argumentsText(s) : null, text: s.kind === "task" ? cut(argumentsText(s), 48) : "" }),
      el("td", { text: s.queue ?? "" }),
      el("td", { class: "mono", text: lastAttempt ? lastAttempt.node ?? lastAttempt.worker ?? "" : "" }),
      el("td", { class: "num", text: duration(s.duration_s) }),
      el("td", { class: "num", text: s.lease_remaining_s === null ? "–" : s.lease_remaining_s < 0 ? `lapsed ${duration(-s.lease_remaining_s)} ago` : duration(s.lease_remaining_s) }),
      el("td", { class: s.error ? "err" : "result", text: outcome.length > 120 ? outcome.slice(0, 119) + "…" : outcome }),
    );
  });
  const left = data.steps_total - data.steps.length;
  const moreButton =
    data.next_steps === null || data.next_steps === undefined
      ? null
      : el("p", { class: "more-steps" }, el("button", { type: "button", id: "more-steps", text: `Show more steps (${left} more)`, onclick: more }));
  const title = data.steps_total > data.steps.length ? `Steps (${data.steps.length} of ${data.steps_total})` : "Steps";
  return el("section", { class: "panel" }, el("h2", { text: title }), el("table", { id: "steps", class: "grid" }, el("thead", {}, head), el("tbody", {}, rows)), moreButton);
}

function argumentsText(step) {
  const args = (step.args || []).map((a) => JSON.stringify(a));
  const kwargs = Object.entries(step.kwargs || {}).map(([k, v]) => `${k}=${JSON.stringify(v)}`);
  return [...args, ...kwargs].join(", ");
}

function cut(text, limit) {
  return text.length > limit ? text.slice(0, limit - 1) + "…" : text;
}

// What operators did to the run (cancel, retry, signal): who, when, from where.
// A retry keeps the error it cleared, so a retried run still shows its failure.
function auditTrail(data) {
  if (!data.audit || !data.audit.length) return null;
  const head = el("tr", {}, ["when (UTC)", "action", "by", "from", "details"].map((h) => el("th", { text: h })));
  const rows = data.audit.map((entry) => {
    const details = { ...entry.details };
    const previous = details.previous_error;
    delete details.previous_error;
    const rest = Object.keys(details).length ? bounded(details, 120) : null;
    return el(
      "tr",
      { dataset: { action: entry.action, entry: entry.id } },
      el("td", { class: "mono", text: clock(entry.at) }),
      el("td", {}, el("strong", { text: entry.action })),
      el("td", { class: "mono actor", text: entry.actor }),
      el("td", { class: "mono origin", text: entry.origin ?? "–" }),
      el("td", { class: "details" }, rest, previous ? previousError(previous) : null),
    );
  });
  return el("section", { id: "audit", class: "panel" }, el("h2", { text: "Operator actions" }), el("table", { class: "grid" }, el("thead", {}, head), el("tbody", {}, rows)));
}

// The error a retry cleared: its line, and its traceback on demand.
function previousError(error) {
  const trace = typeof error === "object" && error.traceback;
  return el(
    "div",
    { class: "previous-error" },
    el("span", { class: "hint", text: "the run had failed with " }),
    el("span", { class: "error-line", text: errorLine(error) }),
    trace ? el("details", {}, el("summary", { class: "hint", text: "traceback" }), el("pre", { class: "traceback", text: trace })) : null,
  );
}

function canvasTree(data) {
  // A durable canvas: its plan's nodes, indented by depth, each with its step's state.
  if (!data.canvas) return null;
  const steps = new Map(data.steps.map((s) => [s.name, s]));
  const rows = data.canvas.map((n) => {
    const step = steps.get(n.path);
    const isTask = n.kind === "task" || n.kind === "link_error";
    const state = !isTask ? null : step ? badge(step.status) : el("span", { class: "hint", text: "not started" });
    const outcome = step && step.status === "succeeded" ? JSON.stringify(step.result) : step && step.error ? errorLine(step.error) : "";
    const row = el(
      "li",
      { dataset: { node: n.path, kind: n.kind } },
      n.role ? el("span", { class: "hint", text: `${n.role}: ` }) : null,
      el("span", { class: isTask ? "mono" : "", text: n.label }),
      " ",
      el("span", { class: "hint mono", text: n.path }),
      state ? " " : null,
      state,
      outcome ? el("span", { class: step && step.error ? "err" : "result", text: ` ${outcome.length > 80 ? outcome.slice(0, 79) + "…" : outcome}` }) : null,
    );
    row.style.paddingLeft = `${n.depth * 1.5}em`; // CSSOM, which the page's CSP allows
    return row;
  });
  return el("section", { id: "canvas", class: "panel" }, el("h2", { text: "Canvas" }), el("ul", { class: "canvas-tree" }, rows));
}

// Progress events (ctx.set_event): each key's latest value first, then every
// event in the order the run set them. Redrawn on every poll of a live run.
function eventsPanel(data) {
  const events = data.events || [];
  if (!events.length) return null;
  const latest = new Map();
  for (const e of events) {
    const known = latest.get(e.key);
    if (!known || e.number > known.number) latest.set(e.key, e);
  }
  const facts = [...latest.values()].map((e) =>
    el("li", { dataset: { event: e.key } }, el("span", { class: "mono", text: e.key }), " ", el("code", { class: "event-value", text: cut(JSON.stringify(e.value), 200) }), el("span", { class: "hint", text: ` #${e.number} at ${clock(e.at)}` })),
  );
  const head = el("tr", {}, ["set at (UTC)", "key", "#", "value"].map((h) => el("th", { text: h })));
  const rows = events.map((e) =>
    el("tr", { dataset: { step: e.step } }, el("td", { class: "mono", text: clock(e.at) }), el("td", { class: "mono", text: e.key }), el("td", { text: String(e.number) }), el("td", {}, el("code", { text: cut(JSON.stringify(e.value), 200) }))),
  );
  const wasOpen = document.getElementById("all-events")?.open; // kept open across polls
  const all = el("details", { id: "all-events", open: wasOpen ? "" : null }, el("summary", { class: "hint", text: `all ${events.length} event(s), in order` }), el("table", { class: "grid" }, el("thead", {}, head), el("tbody", {}, rows)));
  return el("section", { id: "events", class: "panel" }, el("h2", { text: "Progress" }), el("ul", { class: "events-latest" }, facts), all);
}

function extras(data) {
  const parts = [];
  if (data.signals.length) {
    parts.push(
      el("div", { id: "signals" }, el("h3", { text: "Signals" }), el("ul", {}, data.signals.map((s) => el("li", { dataset: { signal: s.name } }, el("span", { class: "mono", text: s.name }), " ", el("code", { text: JSON.stringify(s.payload) }), s.taken ? el("span", { class: "hint", text: " (taken by its wait)" }) : el("span", { class: "hint", text: " (not waited for yet)" }))))),
    );
  }
  if (data.timers.length) {
    parts.push(
      el("div", { id: "timers" }, el("h3", { text: "Timers" }), el("ul", {}, data.timers.map((t) => el("li", { dataset: { timer: t.step } }, el("span", { class: "mono", text: t.step }), ` ${t.kind.replace("_", " ")} at ${clock(t.wake_at)}`, t.pending ? ` (due in ${duration(t.due_in_s)})` : " (fired)")))),
    );
  }
  return parts.length ? el("section", { class: "panel extras" }, ...parts) : null;
}

document.getElementById("home").addEventListener("click", (event) => {
  event.preventDefault();
  navigate("?");
});

route();
