// Small helpers shared by the page's views: building DOM nodes safely and
// writing times, durations and JSON for people. Every value from the store
// goes in as text (textContent), never as markup.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  setAttrs(node, attrs);
  append(node, children);
  return node;
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.setAttribute("class", value);
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function append(node, children) {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function ms(iso) {
  return iso ? Date.parse(iso) : null;
}

export function clock(iso) {
  if (!iso) return "–";
  return iso.replace("T", " ").replace(/(\.\d+)?(Z|\+00:00)$/, "") + " UTC";
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const sign = seconds < 0 ? "-" : "";
  let s = Math.abs(seconds);
  if (s < 1) return `${sign}${Math.round(s * 1000)} ms`;
  if (s < 60) return `${sign}${s.toFixed(1)} s`;
  s = Math.floor(s);
  if (s < 3600) return `${sign}${Math.floor(s / 60)} m ${s % 60} s`;
  if (s < 86400) return `${sign}${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} m`;
  return `${sign}${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

export function json(value) {
  return JSON.stringify(value, null, 2);
}

export function errorLine(error) {
  if (!error) return null;
  if (typeof error === "string") return error;
  const kind = error.type || "Error";
  return error.message ? `${kind}: ${error.message}` : kind;
}

export function badge(status, extra = "") {
  return el("span", { class: `badge status-${status} ${extra}`.trim(), text: status });
}

// The error block of a run, step or attempt: the one line, then its traceback.
export function errorBlock(error) {
  if (!error) return null;
  const line = errorLine(error);
  const trace = typeof error === "object" && error.traceback;
  return el(
    "div",
    { class: "error" },
    el("div", { class: "error-line", text: line }),
    trace ? el("pre", { class: "traceback", text: trace }) : null,
  );
}

// What a live run waits for, in words: a signal (and its timeout) or a timer.
export function waitingText(waiting) {
  if (!waiting) return null;
  if (waiting.for === "signal") return `waiting for signal ${waiting.name}` + (waiting.until ? ` (timeout ${clock(waiting.until)})` : "");
  return `sleeping until ${clock(waiting.until)}`;
}

// A value bounded for display: its JSON cut at `limit` characters; a longer
// one opens to show it whole (a <details> the reader expands).
export const SHOWN_CHARS = 160;

export function bounded(value, limit = SHOWN_CHARS, attrs = {}) {
  const whole = JSON.stringify(value, null, 2);
  const line = JSON.stringify(value);
  if (line.length <= limit) return el("code", { class: "value", ...attrs, text: line });
  return el(
    "details",
    { class: "value long", ...attrs },
    el("summary", {}, el("code", { text: line.slice(0, limit - 1) + "…" }), el("span", { class: "hint", text: ` show all (${line.length} characters)` })),
    el("pre", { text: whole }),
  );
}
