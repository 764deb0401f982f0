"use strict";
// The operators' console. Everything shown comes from the API and is set with textContent,
// never parsed as HTML; times are read against the database's clock (`now` in the answers).
const $ = (id) => document.getElementById(id);
const TERMINAL = new Set(["completed", "failed", "cancelled"]);
const TABS = ["running", "queued", "scheduled", "retrying", "paused", "failed", "all"];
const MAX_EVENT_LINES = 300;  // the page shows the newest; the API keeps them all
const PAGE = 50, MAX_PAGE = 500;  // as the API's listing
const COLORS = ["#2f6fde", "#c98a14", "#8e44ad", "#1f9d55", "#d64545", "#16a2b8", "#6b7280"];
const SVG = "http://www.w3.org/2000/svg";

const tokenField = $("token");
tokenField.value = localStorage.getItem("workerApiToken") || "";
tokenField.addEventListener("input", () => {
  localStorage.setItem("workerApiToken", tokenField.value.trim());
});

async function api(path, options = {}) {
  const headers = { "Accept": "application/json" };
  const token = tokenField.value.trim();
  if (options.method === "POST") {
    headers["Content-Type"] = "application/json";
    if (token) headers["Authorization"] = "Bearer " + token;
  }
  const response = await fetch(path, { ...options, headers });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) {
    const reason = body && body.error ? body.error : response.statusText;
    throw new Error(response.status + ": " + reason);
  }
  return body;
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}
function badge(status) { return el("span", status, "badge s-" + status); }
function pretty(value) { return JSON.stringify(value, null, 2); }

// -- time, on the database's clock ---------------------------------------------------------

let clockOffset = 0;  // the database's now less this browser's
function syncClock(iso) { if (iso) clockOffset = Date.parse(iso) - Date.now(); }
function now() { return Date.now() + clockOffset; }
function span(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "";
  const s = Math.max(0, seconds);
  if (s < 10) return s.toFixed(1) + " s";
  if (s < 90) return Math.round(s) + " s";
  if (s < 5400) return Math.round(s / 60) + " min";
  if (s < 172800) return (s / 3600).toFixed(1) + " h";
  return Math.round(s / 86400) + " d";
}
function since(iso) { return iso ? (now() - Date.parse(iso)) / 1000 : null; }
function ago(iso) { return iso ? span(since(iso)) + " ago" : ""; }
function clock(at) {  // HH:MM, this browser's time zone, 24 hours
  const d = new Date(at);
  return String(d.getHours()).padStart(2, "0") + ":" + String(d.getMinutes()).padStart(2, "0");
}
function absolute(iso) { return iso ? new Date(iso).toLocaleString() : ""; }
function took(job) {
  if (!job.started_at) return null;
  const end = job.finished_at ? Date.parse(job.finished_at) : now();
  return (end - Date.parse(job.started_at)) / 1000;
}
// A job's state as an operator reads it: a pending job is scheduled until due, retrying
// once an attempt failed.
function stateOf(job) {
  if (job.status === "pending") {
    if (job.retry_count > 0) return "retrying";
    return Date.parse(job.run_at) > now() ? "scheduled" : "queued";
  }
  return job.status === "processing" ? "running" : job.status;
}
// The random tail of a UUIDv7: its first twelve digits are its creation time.
function shortId(id) { return "…" + id.slice(-8); }

// -- views ---------------------------------------------------------------------------------

let view = "jobs";
function showView(name) {
  view = name;
  for (const button of document.querySelectorAll("#views button")) {
    button.setAttribute("aria-selected", String(button.dataset.view === name));
  }
  for (const v of ["jobs", "queues", "workers"]) $(v + "-view").hidden = v !== name;
  refresh();
}
for (const button of document.querySelectorAll("#views button")) {
  button.addEventListener("click", () => {
    location.hash = button.dataset.view === "jobs" && current ? "job=" + current
      : button.dataset.view;
  });
}

// -- the job list --------------------------------------------------------------------------

let tab = "all";
let cursor = null;   // the list's next page
let shown = 0;       // rows in the list
let listSeq = 0;     // answers to an older filter are dropped

function buildTabs(counts = {}) {
  const box = $("tabs");
  if (!box.childElementCount) {
    for (const name of TABS) {
      const button = el("button", name);
      button.type = "button";
      button.setAttribute("role", "tab");
      button.dataset.tab = name;
      button.id = "tab-" + name;
      button.append(el("span", "", "n"));
      button.addEventListener("click", () => { tab = name; buildTabs(); loadJobs("first"); });
      box.append(button);
    }
  }
  for (const button of box.children) {
    button.setAttribute("aria-selected", String(button.dataset.tab === tab));
    const n = counts[button.dataset.tab];
    if (n !== undefined) button.querySelector(".n").textContent = String(n);
  }
}

function sinceValue() {
  const value = $("f-since").value;  // "HH:MM", today, this browser's time zone
  if (!value) return null;
  const [h, m] = value.split(":").map(Number);
  const at = new Date(now());
  at.setHours(h, m, 0, 0);
  return at.toISOString();
}

function filterOf() {
  const f = { tab };
  const q = $("search").value.trim(), task = $("f-task").value.trim();
  const queue = $("f-queue").value.trim(), from = sinceValue();
  if (q) f.q = q;
  if (task) f.task = task;
  if (queue) f.queue = queue;
  if (from) f.since = from;
  return f;
}
function describeFilter(f) {
  const parts = [f.tab === "all" ? "any state" : f.tab];
  if (f.task) parts.push("task " + f.task);
  if (f.queue) parts.push("queue " + f.queue);
  if (f.q) parts.push('matching "' + f.q + '"');
  if (f.since) parts.push("since " + clock(f.since));
  return parts.join(", ");
}

function jobRow(job) {
  const row = el("tr", null, "job");
  row.dataset.jobId = job.id;
  row.tabIndex = 0;
  if (job.id === current) row.classList.add("selected");
  const state = stateOf(job);
  const id = el("td"); id.append(el("code", shortId(job.id))); id.title = job.id;
  const stateCell = el("td"); stateCell.append(badge(state));
  if (job.cancel_requested && !TERMINAL.has(job.status)) stateCell.append(el("span", " ✕", "muted"));
  const tries = job.retry_count + 1;
  const created = el("td", ago(job.created_at), "c-created"); created.title = absolute(job.created_at);
  let due = "";
  if (job.status === "pending") {
    const wait = -since(job.run_at);
    due = wait > 0 ? "in " + span(wait) : "now";
  }
  const dueCell = el("td", due, "c-due"); dueCell.title = absolute(job.run_at);
  const worker = job.worker_host ? job.worker_host + ":" + job.worker_pid : "";
  row.append(id, el("td", job.task, "c-task"), el("td", job.queue, "c-queue"), stateCell,
             el("td", job.max_retries !== null ? tries + "/" + (job.max_retries + 1) : tries,
                "num c-attempts"),
             el("td", job.priority, "num c-priority"), created, dueCell,
             el("td", span(took(job)), "num"), el("td", worker, "c-worker"));
  const error = el("td", job.error || "", "c-error muted");
  error.title = job.error || "";
  row.append(error);
  row.addEventListener("click", () => { location.hash = "job=" + job.id; });
  row.addEventListener("keydown", (e) => {
    if (e.key === "Enter" || e.key === " ") { e.preventDefault(); row.click(); }
  });
  return row;
}

function listQuery() {
  const params = new URLSearchParams(filterOf());
  if (params.get("tab") === "all") params.delete("tab");
  return params;
}

// "first": the first page (a filter changed); "more": the next page, added below;
// "refresh": every row shown, read again, so pages added with "more" stay. Past the API's
// largest page a refresh would drop rows: the list is then left as it is.
async function loadJobs(mode = "first") {
  if (mode === "refresh" && shown > MAX_PAGE) return;
  const seq = mode === "first" ? ++listSeq : listSeq;
  const params = listQuery();
  params.set("limit", String(mode === "refresh" ? Math.max(PAGE, shown) : PAGE));
  if (mode === "more" && cursor) params.set("cursor", cursor);
  try {
    const page = await api("/console/jobs?" + params);
    if (seq !== listSeq) return;
    syncClock(page.now);
    buildTabs(page.counts);
    const body = $("jobs").tBodies[0];
    const focused = document.activeElement && document.activeElement.dataset
      ? document.activeElement.dataset.jobId : null;
    if (mode !== "more") body.replaceChildren();
    for (const job of page.jobs) body.append(jobRow(job));
    if (focused) {
      const again = body.querySelector(`tr[data-job-id="${focused}"]`);
      if (again) again.focus();
    }
    shown = body.rows.length;
    cursor = page.next_cursor;
    $("more").hidden = !cursor;
    $("no-jobs").hidden = shown > 0;
    health(true);
  } catch (e) {
    health(false, e);
  }
}
$("more").addEventListener("click", () => loadJobs("more"));
$("filters").addEventListener("submit", (e) => { e.preventDefault(); loadJobs("first"); });
let typing = null;
for (const id of ["search", "f-task", "f-queue", "f-since"]) {
  $(id).addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => loadJobs("first"), 250);
  });
}

function health(ok, error) {
  $("health").textContent = ok ? "database ok" : "unavailable: " + error.message;
  $("health").className = ok ? "muted" : "error";
}

// -- bulk retry and cancel, over the list's filter ---------------------------------------

let pendingBulk = null;
async function askBulk(verb) {
  const f = filterOf();
  $("bulk-message").textContent = "";
  try {
    const count = await api("/console/bulk?" + new URLSearchParams({ verb, ...f }));
    if (!count.jobs) {
      $("bulk-message").textContent = `no job to ${verb} among ${describeFilter(f)}`;
      return;
    }
    pendingBulk = { verb, filter: f, expected: count.jobs };
    const noun = count.jobs === 1 ? "job" : "jobs";
    $("confirm-text").textContent =
      `${verb === "retry" ? "Retry" : "Cancel"} ${count.jobs} ${noun} (${describeFilter(f)})?`;
    $("confirm").hidden = false;
    $("confirm-yes").focus();
  } catch (e) {
    $("bulk-message").textContent = verb + " refused: " + e.message;
  }
}
async function doBulk() {
  const asked = pendingBulk;
  $("confirm").hidden = true;
  pendingBulk = null;
  if (!asked) return;
  try {
    const done = await api("/console/bulk", { method: "POST", body: JSON.stringify(asked) });
    const verbed = done.verb === "retry" ? "retried" : "cancelled";
    $("bulk-message").textContent = `${done.changed} ${verbed}` +
      (done.unchanged ? `, ${done.unchanged} left as they were` : "") +
      (done.more ? "; more match now" : "");
  } catch (e) {
    $("bulk-message").textContent = asked.verb + " refused: " + e.message;
  }
  loadJobs("first");
}
$("bulk-retry").addEventListener("click", () => askBulk("retry"));
$("bulk-cancel").addEventListener("click", () => askBulk("cancel"));
$("confirm-yes").addEventListener("click", doBulk);
$("confirm-no").addEventListener("click", () => { $("confirm").hidden = true; pendingBulk = null; });

// -- one job -------------------------------------------------------------------------------

let current = null;      // the job shown
let stream = null;       // its EventSource
let lastEventId = 0;     // the last event id received, to resume after a retry or resume
let job = null;          // its last state from GET /jobs/{id}
let plan = null;         // its stages in order: from the workers' registry, else its rows
let progressFloor = 0;   // the bar never goes back within an attempt
let reloadTimer = null;
let messageStatus = null;  // the job's status when the message was shown

function setProgress(pct, state, label) {
  const bar = $("progress");
  if (pct !== null) {
    const value = Math.max(progressFloor, Math.min(100, Math.round(pct)));
    progressFloor = value;
    bar.setAttribute("aria-valuenow", String(value));
    bar.querySelector(".fill").style.width = value + "%";
  }
  if (state) bar.dataset.state = state;
  if (label !== undefined) $("progress-label").textContent = label;
}

// The stages in the order they run: the task's list as a worker registered it, else the
// rows (cleanups last); with the rows' own that the list does not know.
function stagePlan(data, context) {
  const names = [];
  if (context && context.stages) names.push(...context.stages, ...(context.cleanups || []));
  for (const s of data.stages) if (!names.includes(s.stage)) names.push(s.stage);
  const cleanups = new Set(context && context.cleanups ? context.cleanups : []);
  return { names, cleanups, known: !!(context && context.stages) };
}

function stageAt(name) {
  const i = plan ? plan.names.indexOf(name) : -1;
  return i < 0 ? null : { index: i, total: plan.names.length };
}

function ofStages(index, total) { return `stage ${index + 1} of ${total}`; }

function finalState(data) {
  const status = data.status;
  if (status === "completed") { setProgress(100, "done", "completed"); return; }
  const failedAt = data.stages.find((s) => s.status === "failed" || s.status === "cancelled");
  const where = failedAt && stageAt(failedAt.stage)
    ? ` at ${ofStages(stageAt(failedAt.stage).index, plan.names.length)}: ${failedAt.stage}` : "";
  const why = data.error ? " — " + data.error.trim().split("\n")[0] : "";
  if (status === "failed") setProgress(null, "failed", "failed" + where + why);
  else if (status === "cancelled") setProgress(null, "cancelled", "cancelled" + where);
}

// The bar and its label from the job's rows, for a job seen without its events yet.
function progressFromRows(data) {
  if (TERMINAL.has(data.status)) { finalState(data); return; }
  if (data.status === "paused") { setProgress(null, "paused", "paused: waiting for an answer"); return; }
  if (data.status === "pending") {
    const state = stateOf(data);
    const wait = -since(data.run_at);
    const label = state === "retrying"
      ? `retrying: attempt ${data.retry_count + 1} ${wait > 0 ? "due in " + span(wait) : "due now"}`
      : state === "scheduled" ? "scheduled: due in " + span(wait) : "queued: waiting for a worker";
    setProgress(null, "idle", label);
    return;
  }
  const total = plan.names.length;
  if (!total) { setProgress(null, "running", "running for " + span(took(data))); return; }
  const done = data.stages.filter((s) => s.status === "completed").length;
  const running = data.stages.find((s) => s.status === "running");
  const at = running ? stageAt(running.stage) : null;
  const index = at ? at.index : Math.min(done, total - 1);
  setProgress(100 * done / total, "running",
              ofStages(index, total) + ": " + plan.names[index] + (plan.known ? "" : " (so far)"));
}

function describe(event) {
  const m = event.message || {};
  const extra = Object.entries(m).filter(([k]) => k !== "pct")
    .map(([k, v]) => k + "=" + (typeof v === "object" ? JSON.stringify(v) : v)).join(" ");
  return event.step + " " + event.status + (extra ? " (" + extra + ")" : "");
}

function onEvent(event) {
  lastEventId = Math.max(lastEventId, event.id);
  const item = el("li", "#" + event.id + " " + describe(event));
  $("events").append(item);
  while ($("events").childElementCount > MAX_EVENT_LINES) $("events").firstElementChild.remove();
  item.scrollIntoView({ block: "nearest" });
  const m = event.message || {};
  const pct = typeof m.pct === "number" ? m.pct : null;
  const at = stageAt(event.step);
  if (event.step === "job" && TERMINAL.has(event.status)) {
    scheduleReload(0);  // the rows say where it ended and why
  } else if (event.status === "paused") {
    setProgress(null, "paused", "paused: waiting for an answer");
  } else if (at) {
    const part = event.status === "completed" ? 1 : (pct !== null ? pct / 100 : 0);
    const label = ofStages(event.status === "completed" && at.index + 1 < at.total
      ? at.index + 1 : at.index, at.total) + ": " + describe(event) +
      (pct !== null ? " — " + pct + "%" : "");
    setProgress(100 * (at.index + part) / at.total, "running", label);
  } else {
    setProgress(pct, "running", describe(event) + (pct !== null ? " — " + pct + "%" : ""));
  }
  if (event.status !== "progress") scheduleReload();
}

function follow(id) {
  if (stream) stream.close();
  const es = new EventSource("/jobs/" + encodeURIComponent(id) + "/events?after=" + lastEventId);
  stream = es;
  es.onmessage = (msg) => { if (current === id) onEvent(JSON.parse(msg.data)); };
  es.addEventListener("end", () => {
    es.close();  // the job is over: do not let the browser reconnect
    if (stream === es) stream = null;
    scheduleReload(0);
  });
  // On a dropped connection EventSource reconnects by itself, sending Last-Event-ID.
}

function scheduleReload(delay = 250) {
  clearTimeout(reloadTimer);
  reloadTimer = setTimeout(() => loadDetail(current), delay);
}

function field(name, value, className) {
  if (value === null || value === undefined || value === "") return;
  const dd = el("dd", value, className);
  $("d-fields").append(el("dt", name), dd);
  return dd;
}

function showBox(name, value) {
  const has = value !== null && value !== undefined && value !== "";
  $(name + "-box").hidden = !has;
  $(name).textContent = has ? (typeof value === "string" ? value : pretty(value)) : "";
}

function stageRows(data) {
  const body = $("stages").tBodies[0];
  body.replaceChildren();
  const rows = new Map(data.stages.map((s) => [s.stage, s]));
  plan.names.forEach((name, i) => {
    const s = rows.get(name);
    const row = el("tr", null, s ? "" : "todo");
    row.dataset.stage = name;
    const status = s ? s.status : "to run";
    const cell = el("td"); cell.append(badge(status));
    if (!s) cell.firstChild.className = "badge s-todo";
    const tookFor = s && s.started_at && s.status !== "waiting" ? span(
      ((s.finished_at ? Date.parse(s.finished_at) : now()) - Date.parse(s.started_at)) / 1000)
      : "";
    const detail = !s ? "" : s.error ? s.error.trim().split("\n").pop()
      : (s.output === null ? "" : JSON.stringify(s.output));
    const out = el("td", detail, "out" + (s && s.error ? " error" : " muted"));
    out.title = detail;
    const cleanup = s ? s.kind === "cleanup" : plan.cleanups.has(name);
    row.append(el("td", i + 1, "num"), el("td", name + (cleanup ? " (cleanup)" : "")),
               cell, el("td", s ? s.attempt : "", "num"), el("td", tookFor, "num"), out);
    body.append(row);
  });
  $("no-stages").hidden = plan.names.length > 0;
  const done = data.stages.filter((s) => s.status === "completed").length;
  $("stage-count").textContent = plan.names.length
    ? `${done} of ${plan.names.length} done` + (plan.known ? "" : " (as the rows show)") : "";
}

async function loadDetail(id) {
  if (!id) return;
  let data, context;
  try {
    [data, context] = await Promise.all([
      api("/jobs/" + encodeURIComponent(id)),
      api("/console/jobs/" + encodeURIComponent(id)).catch(() => null),
    ]);
  } catch (e) {
    if (id === current) message(e.message, true);
    return;
  }
  if (id !== current) return;
  if (context) syncClock(context.now);
  const before = job ? job.status : null;
  job = data;
  plan = stagePlan(data, context);
  if (messageStatus !== null && data.status !== messageStatus) message("");
  if (before && before !== data.status && !TERMINAL.has(data.status) && TERMINAL.has(before)) {
    progressFloor = 0;  // run again: a new attempt starts from nothing
  }
  $("d-id").textContent = data.id;
  const status = $("d-status");
  const state = stateOf(data);
  status.textContent = state + (data.cancel_requested && !TERMINAL.has(data.status)
    ? " (cancel requested)" : "");
  status.className = "badge s-" + state;
  $("d-fields").replaceChildren();
  field("task", data.task); field("queue", data.queue); field("priority", data.priority);
  field("attempts", (data.retry_count + 1) +
        (data.max_retries !== null ? " of at most " + (data.max_retries + 1) : ""));
  const holder = context && context.worker;
  if (holder && data.status === "processing") {
    const stale = holder.heartbeat_age !== null && holder.heartbeat_age > lease;
    field("worker", `${holder.hostname}:${holder.pid}, heartbeat ${span(holder.heartbeat_age)} ago` +
          (stale ? " (missed: presumed dead)" : ""), stale ? "stale" : "");
  }
  field("created", ago(data.created_at) + " (" + absolute(data.created_at) + ")");
  if (data.status === "pending") field("due", absolute(data.run_at));
  if (data.started_at) field("started", ago(data.started_at));
  if (data.finished_at) field("finished", ago(data.finished_at));
  if (data.started_at) field("took", span(took(data)));
  showBox("d-question", data.status === "paused" ? data.question : null);
  showBox("d-result", data.result);
  showBox("d-error", data.error);
  $("d-payload").textContent = pretty(data.payload);
  stageRows(data);
  $("cancel").disabled = TERMINAL.has(data.status);
  $("retry").disabled = !(data.status === "failed" || data.status === "cancelled");
  $("resume").disabled = data.status !== "paused";
  // The final status is shown from the job at once, whether or not its events came.
  // Events, once they come, say more of a running job than its rows.
  if (TERMINAL.has(data.status) || data.status !== "processing" || lastEventId === 0) {
    progressFromRows(data);
  }
}

function openJob(id) {
  if (stream) { stream.close(); stream = null; }
  current = id;
  lastEventId = 0;
  job = null;
  plan = { names: [], cleanups: new Set(), known: false };
  progressFloor = 0;
  $("detail").hidden = !id;
  $("jobs-view").classList.toggle("with-detail", !!id);
  for (const row of $("jobs").tBodies[0].rows) {
    row.classList.toggle("selected", row.dataset.jobId === id);
  }
  if (!id) return;
  $("events").replaceChildren();
  $("stages").tBodies[0].replaceChildren();
  $("d-fields").replaceChildren();
  $("d-id").textContent = id;
  $("d-status").textContent = "";
  message("");
  setProgress(0, "idle", "loading…");
  loadDetail(id);
  follow(id);
}

function message(text, isError = false) {
  $("message").textContent = text;
  $("message").className = isError ? "error" : "";
  messageStatus = text && job ? job.status : null;
}

async function act(verb, body) {
  const id = current;
  if (!id) return;
  try {
    const result = await api("/jobs/" + encodeURIComponent(id) + "/" + verb,
                             { method: "POST", body: body === undefined ? "{}" : body });
    const status = result.status;
    message(verb + ": job is " + status +
            (result.cancel_requested && status === "processing"
              ? " (it stops at its next stage boundary)" : ""));
    messageStatus = status;
    if (verb !== "cancel") {
      // The job runs again: follow its new events from where the last stream ended.
      progressFloor = 0;
      setProgress(0, "running", "queued again");
      follow(id);
    }
  } catch (e) {
    message(verb + " refused: " + e.message, true);
  }
  loadDetail(id);
  loadJobs("refresh");
}

$("cancel").addEventListener("click", () => act("cancel"));
$("retry").addEventListener("click", () => act("retry"));
$("resume").addEventListener("click", () => {
  const text = $("answer").value.trim();
  let answer = null;
  if (text) {
    try { answer = JSON.parse(text); } catch (e) {
      message("the answer is not valid JSON: " + e.message, true);
      return;
    }
  }
  act("resume", JSON.stringify({ answer }));
});
$("close").addEventListener("click", () => { location.hash = "jobs"; });

// -- queues and charts -----------------------------------------------------------------------

// A queue's pause and limits, as `worker queues` shows them.
function controlsOf(q) {
  if (!q) return "";
  const parts = [];
  if (q.paused) parts.push("paused");
  if (q.concurrency !== null) parts.push(`${q.concurrency} at once`);
  if (q.rate !== null) parts.push(`${q.rate}/s`);
  return parts.join(", ");
}

async function queueChange(name, verb, body) {
  try {
    await api("/queues/" + encodeURIComponent(name) + "/" + verb,
              { method: "POST", body: JSON.stringify(body || {}) });
    $("queue-message").textContent = `${name}: ${verb} done`;
  } catch (e) {
    $("queue-message").textContent = `${name}: ${verb} refused: ${e.message}`;
  }
  loadQueues();
}

function limitEditor(name, q) {
  const cell = el("td", null, "limit");
  const conc = el("input"); conc.type = "number"; conc.min = "1"; conc.placeholder = "at once";
  conc.setAttribute("aria-label", name + " concurrency");
  const rate = el("input"); rate.type = "number"; rate.min = "0"; rate.step = "any";
  rate.placeholder = "per s"; rate.setAttribute("aria-label", name + " rate");
  if (q && q.concurrency !== null) conc.value = q.concurrency;
  if (q && q.rate !== null) rate.value = q.rate;
  const toggle = el("button", q && q.paused ? "Resume" : "Pause");
  toggle.className = "toggle";
  toggle.addEventListener("click", () => queueChange(name, q && q.paused ? "resume" : "pause"));
  const set = el("button", "Set limits");
  set.className = "set";
  set.addEventListener("click", () => queueChange(name, "limit", {
    concurrency: conc.value ? Number(conc.value) : null,
    rate: rate.value ? Number(rate.value) : null,
  }));
  cell.append(toggle, " ", conc, " ", rate, " ", set);
  return cell;
}

let editing = false;  // a limit being typed is not redrawn under the cursor
async function loadQueues() {
  if (editing) return;
  try {
    const [stats, controls] = await Promise.all([api("/stats"), api("/queues")]);
    const byName = new Map(controls.queues.map((q) => [q.name, q]));
    const names = [...new Set([...stats.queues.map((q) => q.queue), ...byName.keys()])].sort();
    const byStats = new Map(stats.queues.map((q) => [q.queue, q]));
    const body = $("stats").tBodies[0];
    body.replaceChildren();
    for (const name of names) {
      const s = byStats.get(name);
      const counts = s ? s.counts : {};
      const q = byName.get(name);
      const row = el("tr");
      row.dataset.queue = name;
      const waiting = s ? s.oldest_pending_seconds : null;
      if (waiting !== null && waiting > 60) row.classList.add("backlog");
      row.append(el("td", name), el("td", counts.pending || 0, "num"),
                 el("td", counts.processing || 0, "num"), el("td", counts.failed || 0, "num"),
                 el("td", counts.paused || 0, "num c-paused"));
      const since = el("td", waiting === null ? "" :
        span(waiting) + " (since " + clock(new Date(now() - waiting * 1000)) + ")", "num waiting");
      row.append(since, el("td", controlsOf(q), "controls"), limitEditor(name, q));
      body.append(row);
    }
    health(true);
  } catch (e) {
    health(false, e);
  }
}
$("stats").addEventListener("focusin", (e) => { editing = e.target.tagName === "INPUT"; });
$("stats").addEventListener("focusout", () => { editing = false; });

function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== undefined) node.textContent = String(text);
  return node;
}
const W = 600, H = 140, LEFT = 34, BOTTOM = 16, TOP = 6;
function axes(box, buckets, max) {
  box.append(svg("text", { x: 2, y: TOP + 8 }, max),
             svg("text", { x: 2, y: H - BOTTOM }, 0),
             svg("line", { x1: LEFT, y1: H - BOTTOM, x2: W, y2: H - BOTTOM, stroke: "#ccd" }));
  for (const i of [0, Math.floor(buckets.length / 2), buckets.length - 1]) {
    const x = LEFT + (W - LEFT) * i / buckets.length;
    box.append(svg("text", { x: Math.min(x, W - 30), y: H - 3 }, clock(buckets[i])));
  }
}

function drawOutcomes(chart) {
  const box = $("chart-outcomes");
  box.replaceChildren();
  const points = chart.outcomes;
  const max = Math.max(1, ...points.map((p) => p.completed + p.failed));
  const width = (W - LEFT) / points.length, high = H - BOTTOM - TOP;
  let completed = 0, failed = 0;
  points.forEach((p, i) => {
    completed += p.completed; failed += p.failed;
    const x = LEFT + i * width, c = high * p.completed / max, f = high * p.failed / max;
    const title = `${clock(p.bucket)}: ${p.completed} completed, ${p.failed} failed`;
    if (p.completed) {
      const bar = svg("rect", { x, y: H - BOTTOM - c, width: Math.max(1, width - 1), height: c,
                                fill: "#1f9d55", class: "completed" });
      bar.append(svg("title", {}, title)); box.append(bar);
    }
    if (p.failed) {
      const bar = svg("rect", { x, y: H - BOTTOM - c - f, width: Math.max(1, width - 1),
                                height: f, fill: "#d64545", class: "failed" });
      bar.append(svg("title", {}, title)); box.append(bar);
    }
  });
  axes(box, points.map((p) => p.bucket), max);
  box.dataset.completed = completed; box.dataset.failed = failed;
  box.setAttribute("aria-label", `${completed} completed and ${failed} failed in the last ` +
                   chart.window);
}

function drawDepth(chart) {
  const box = $("chart-depth"), legend = $("depth-legend");
  box.replaceChildren(); legend.replaceChildren();
  const queues = Object.entries(chart.depth);
  const max = Math.max(1, ...queues.flatMap(([, ps]) => ps.map((p) => p.pending || 0)));
  const high = H - BOTTOM - TOP;
  const labels = [];
  queues.forEach(([name, ps], k) => {
    const color = COLORS[k % COLORS.length];
    const step = (W - LEFT) / ps.length;
    // A line per run of sampled buckets: a bucket no worker sampled is a gap, not a zero.
    let run = [];
    const lines = [];
    ps.forEach((p, i) => {
      if (p.pending === null) { if (run.length) lines.push(run); run = []; return; }
      run.push(`${(LEFT + (i + 0.5) * step).toFixed(1)},` +
               `${(H - BOTTOM - high * p.pending / max).toFixed(1)}`);
    });
    if (run.length) lines.push(run);
    for (const points of lines) {
      const path = svg("polyline", { points: points.join(" "), fill: "none", stroke: color,
                                     "stroke-width": 2 });
      path.dataset.queue = name;
      path.append(svg("title", {}, name));
      box.append(path);
    }
    // The latest sample, and since when the queue has had due jobs waiting without a break.
    let last = ps.length - 1;
    while (last >= 0 && ps[last].pending === null) last--;
    const depth = last >= 0 ? ps[last].pending : 0;
    let from = last;
    while (from > 0 && (ps[from - 1].pending === null || ps[from - 1].pending > 0)) from--;
    while (from < last && ps[from].pending === null) from++;
    const item = el("span");
    item.dataset.queue = name;
    const swatch = el("i"); swatch.style.background = color;
    item.append(swatch, name + ": " + depth + " due" +
      (depth > 0 ? " — waiting since " + clock(ps[from].bucket) : ""));
    legend.append(item);
    labels.push(`${name} ${depth}`);
  });
  if (queues.length) axes(box, queues[0][1].map((p) => p.bucket), max);
  box.setAttribute("aria-label", "due jobs per queue: " + (labels.join(", ") || "none"));
}

async function loadCharts() {
  try {
    const chart = await api("/console/charts?window=" + $("window").value);
    document.querySelector(".per").textContent = chart.bucket_seconds === 60 ? "minute" : "10 min";
    drawOutcomes(chart);
    drawDepth(chart);
  } catch (e) {
    health(false, e);
  }
}
$("window").addEventListener("change", loadCharts);

// -- workers ---------------------------------------------------------------------------------

let lease = 15;
async function loadWorkers() {
  try {
    const answer = await api("/console/workers");
    syncClock(answer.now);
    lease = answer.lease_seconds;
    $("lease").textContent = `(a heartbeat older than ${span(lease)} is missed)`;
    const body = $("workers").tBodies[0];
    body.replaceChildren();
    for (const w of answer.workers) {
      const row = el("tr");
      row.dataset.workerId = w.id;
      const stale = w.heartbeat_age > lease;
      if (stale) row.classList.add("stale");
      const held = el("td", null, "jobs-held");
      for (const j of w.jobs) {
        const link = el("a", `${j.task} ${shortId(j.id)} (${span(since(j.started_at))})`);
        link.href = "#job=" + j.id;
        link.dataset.jobId = j.id;
        held.append(link);
      }
      row.append(el("td", w.hostname), el("td", w.pid, "num"),
                 el("td", w.queues.join(", "), "c-queues"),
                 el("td", `${w.jobs.length}/${w.concurrency}`, "num"),
                 el("td", span(since(w.started_at)), "c-started"),
                 el("td", span(w.heartbeat_age) + (stale ? " missed" : ""), "num heartbeat"), held);
      body.append(row);
    }
    $("no-workers").hidden = answer.workers.length > 0;
    health(true);
  } catch (e) {
    health(false, e);
  }
}

// -- keyboard, the address, the refresh --------------------------------------------------------

document.addEventListener("keydown", (e) => {
  const typingHere = /^(INPUT|TEXTAREA|SELECT)$/.test(e.target.tagName);
  if (e.key === "/" && !typingHere) {
    e.preventDefault();
    if (view !== "jobs") location.hash = "jobs";
    $("search").focus();
  } else if (e.key === "Escape") {
    if (!$("confirm").hidden) { $("confirm").hidden = true; pendingBulk = null; }
    else if (current) location.hash = "jobs";
  }
});

function fromHash() {
  const hash = location.hash.replace(/^#/, "");
  const match = /^job=([0-9a-fA-F-]{36})$/.exec(hash);
  const id = match ? match[1].toLowerCase() : null;
  const name = id ? "jobs" : (["queues", "workers"].includes(hash) ? hash : "jobs");
  if (id !== current) openJob(id);
  if (name !== view) showView(name);
}
window.addEventListener("hashchange", fromHash);

let chartsAt = 0;
function refresh() {
  if (view === "jobs") {
    loadJobs("refresh");
    // A plain task sends no stage events: poll its detail until it finishes.
    if (current && (!job || !TERMINAL.has(job.status))) loadDetail(current);
  } else if (view === "queues") {
    loadQueues();
    if (Date.now() - chartsAt > 10000) { chartsAt = Date.now(); loadCharts(); }
  } else {
    loadWorkers();
  }
}
function tick() { if (!document.hidden) refresh(); }
buildTabs();
api("/console/workers").then((a) => { lease = a.lease_seconds; }).catch(() => {});
fromHash();
loadJobs("first");
setInterval(tick, 2000);
