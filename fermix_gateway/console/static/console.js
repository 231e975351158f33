// The Fermix console's actions and live updates: /v1 with the session cookie and its CSRF
// token. Text from conversations and tools only ever goes into textContent.
"use strict";

const csrf = () => document.querySelector('meta[name="csrf-token"]').content;

async function call(method, path, body) {
  const resp = await fetch(path, {
    method, credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf() },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  let data = {};
  try { data = await resp.json(); } catch (e) { /* an empty body */ }
  if (!resp.ok) {
    const err = data.error;
    throw new Error(typeof err === "string" ? err : (err && err.message) || `HTTP ${resp.status}`);
  }
  return data;
}

function notice(text) {
  const el = document.getElementById("notice");
  el.textContent = text;
  el.hidden = !text;
}

function wire(selector, handler) {
  document.querySelectorAll(selector).forEach((el) => el.addEventListener("click", async () => {
    el.disabled = true;
    try { await handler(el); } catch (e) { notice(e.message); } finally { el.disabled = false; }
  }));
}

function answers() {
  wire("button.answer", async (el) => {
    const row = el.closest("tr");
    const reason = row.querySelector("input.reason").value || undefined;
    const done = await call("POST", `/v1/approvals/${el.dataset.id}`,
                            { decision: el.dataset.decision, reason });
    row.querySelector(".result").textContent = `${done.status} by ${done.decidedBy}`;
    row.querySelectorAll("button").forEach((b) => b.remove());
  });
}

function agents() {
  wire("button.agent-action", async (el) => {
    const done = await call("POST", `/v1/agents/${el.dataset.agent}/${el.dataset.action}`);
    const row = el.closest("tr");
    row.querySelector(".state").textContent = done.state;
    row.querySelector(".pending").textContent = done.pending;
    const paused = done.state === "paused";
    el.dataset.action = paused ? "resume" : "pause";
    el.textContent = paused ? "Resume" : "Pause";
  });
}

function actions() {
  wire("button.act", async (el) => {
    const started = await call("POST", "/console/act", { key: el.dataset.key, action: el.dataset.act });
    const done = await call("GET", `/v1/runs/${encodeURIComponent(started.runId)}/wait?timeout=30`);
    notice(done.reply || done.error || done.status);
  });
}

function kills() {
  wire("button.agent-kill", async (el) => {
    const name = el.dataset.agent;
    if (!window.confirm(`Kill ${name} for good? Its running turns stop and its messages are refused until its definition is re-created.`)) return;
    const done = await call("POST", `/v1/agents/${name}/kill`);
    const row = el.closest("tr");
    row.querySelector(".state").textContent = done.state;
    row.querySelectorAll("button").forEach((b) => b.remove());
  });
}

function follow(runId) {
  const live = document.getElementById("live");
  const text = document.getElementById("live-text");
  const tools = document.getElementById("live-tools");
  const status = document.getElementById("live-status");
  live.hidden = false;
  live.dataset.run = runId;
  document.getElementById("live-timeline").href = `/console/run/${encodeURIComponent(runId)}`;
  text.textContent = "";
  tools.textContent = "";
  status.textContent = "running…";
  const source = new EventSource(`/v1/runs/${encodeURIComponent(runId)}/events`);
  source.addEventListener("assistant", (e) => {
    const d = JSON.parse(e.data);
    text.textContent += d.delta || d.text || "";
  });
  source.addEventListener("tool", (e) => {
    const d = JSON.parse(e.data);
    const li = document.createElement("li");
    li.textContent = `${d.phase} ${d.name}${d.isError ? " (error)" : ""}`;
    li.dataset.phase = d.phase;
    tools.appendChild(li);
  });
  source.addEventListener("compaction", (e) => {
    const d = JSON.parse(e.data);
    const li = document.createElement("li");
    li.textContent = `compaction ${d.phase}`;
    li.dataset.phase = `compaction-${d.phase}`;
    tools.appendChild(li);
  });
  source.addEventListener("lifecycle", (e) => {
    const d = JSON.parse(e.data);
    if (d.phase === "end" || d.phase === "error") {
      status.textContent = d.phase === "end" ? "done" : `error: ${d.error || ""}`;
      live.dataset.done = d.phase;
      source.close();
    }
  });
  source.onerror = () => { if (live.dataset.done) source.close(); };
}

function talk() {
  const form = document.getElementById("talk");
  if (!form) return;
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const box = document.getElementById("message");
    const consoleChat = form.dataset.channel === "console";
    const body = { message: box.value, chatId: form.dataset.chat };
    if (!consoleChat) body.threadScope = form.dataset.thread;
    if (form.dataset.agent) body.agent = form.dataset.agent;
    try {
      const started = await call("POST", consoleChat ? "/console/send" : "/v1/agent", body);
      const li = document.createElement("li");
      li.className = "msg user";
      li.textContent = box.value;
      document.getElementById("transcript").appendChild(li);
      box.value = "";
      follow(started.runId);
    } catch (err) { notice(err.message); }
  });
}

function replayed(body) {
  const lines = body.steps.map((st) => `${String(st.step).padStart(3)}  ${st.kind.padEnd(5)}  ${st.summary}`);
  const d = body.divergence;
  if (d) lines.push(`Diverged at step ${d.step} (${d.kind}): ${d.what}.`);
  else if (body.reproduced) lines.push("Reproduced: the same tool calls and the same reply.");
  return lines.join("\n");
}

function flight() {
  const section = document.getElementById("flight");
  if (!section) return;
  const run = encodeURIComponent(section.dataset.run);
  wire("#replay", async () => {
    const out = document.getElementById("replay-result");
    out.textContent = "replaying…";
    out.hidden = false;
    out.textContent = replayed(await call("POST", `/v1/runs/${run}/replay`, {}));
  });
  const form = document.getElementById("fork");
  if (!form) return;
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const button = form.querySelector("button");
    button.disabled = true;
    try {
      const body = await call("POST", `/v1/runs/${run}/fork`, {
        step: Number(document.getElementById("fork-step").value) || 1,
        model: document.getElementById("fork-model").value,
      });
      const table = document.getElementById("fork-result");
      const tools = (side) => side.toolCalls.map((c) => c.name).join(", ") || "none";
      for (const [prefix, side] of [["o", body.original], ["f", body.fork]]) {
        table.querySelector(`.${prefix}-run`).textContent = `${side.runId} (${side.label})`;
        table.querySelector(`.${prefix}-tools`).textContent = tools(side);
        table.querySelector(`.${prefix}-tokens`).textContent = `${side.inputTokens}/${side.outputTokens}`;
        table.querySelector(`.${prefix}-usd`).textContent = `$${side.usd.toFixed(6)}`;
        table.querySelector(`.${prefix}-reply`).textContent = side.reply;
      }
      table.hidden = false;
    } catch (err) { notice(err.message); } finally { button.disabled = false; }
  });
}

function signOut() {
  const btn = document.getElementById("logout");
  if (!btn) return;
  btn.addEventListener("click", async () => {
    await fetch("/console/logout", { method: "POST", credentials: "same-origin",
                                     headers: { "X-CSRF-Token": csrf() } });
    window.location = "/console/login";
  });
}

function refresh() {
  const el = document.getElementById("live-fleet");
  if (!el) return;
  setInterval(() => { if (!document.hidden) window.location.reload(); },
              Number(el.dataset.refresh) * 1000);
}

document.addEventListener("DOMContentLoaded", () => {
  refresh();
  answers();
  agents();
  actions();
  kills();
  talk();
  flight();
  signOut();
  const live = document.getElementById("live");
  if (live && live.dataset.run) follow(live.dataset.run);
});
