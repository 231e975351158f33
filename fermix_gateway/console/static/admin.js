// The console's scheduled jobs and skills views: pause, resume, run now and delete a job,
// and reload the skill registry, through /v1 with the session's CSRF token. Text only ever
// goes into textContent.
"use strict";

(() => {
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

  function say(text) {
    const el = document.getElementById("notice");
    el.textContent = text;
    el.hidden = !text;
  }

  // A time in ms as the server writes it: "2025-01-31 12:00:05" (UTC), or "-".
  const utc = (ms) => (ms == null ? "-" : new Date(ms).toISOString().replace("T", " ").slice(0, 19));

  function show(holder, job) {
    holder.dataset.state = job.state;
    holder.querySelector(".state").textContent = job.state;
    const next = holder.querySelector(".next-run");
    next.textContent = utc(job.nextRunAt);
    next.dataset.ms = job.nextRunAt == null ? "" : String(job.nextRunAt);
    const toggle = holder.querySelector("button.job-action[data-action=pause], " +
                                        "button.job-action[data-action=resume]");
    if (toggle) {
      toggle.dataset.action = job.paused ? "resume" : "pause";
      toggle.textContent = job.paused ? "Resume" : "Pause";
    }
  }

  async function act(btn) {
    const name = btn.dataset.job;
    const path = `/v1/schedules/${encodeURIComponent(name)}`;
    const holder = btn.closest("[data-job]:not(button)");
    const action = btn.dataset.action;
    if (action === "delete") {
      if (!window.confirm(`Delete the job '${name}' and its run history?`)) return;
      await call("DELETE", path);
      if (holder.tagName === "TR") holder.remove();
      else window.location.assign("/console/schedules");
      say(`Deleted job '${name}'.`);
      return;
    }
    if (action === "run") {
      const done = await call("POST", `${path}/run`);
      say(`Started a run of job '${name}': ${done.runId}`);
      return;
    }
    const job = await call("POST", `${path}/${action}`);
    show(holder, job);
    say(action === "pause" ? `Paused job '${name}'.`
                           : `Resumed job '${name}': ${job.state}, next run ${utc(job.nextRunAt)}.`);
  }

  function jobButtons() {
    document.querySelectorAll("button.job-action").forEach((btn) => {
      btn.addEventListener("click", async () => {
        btn.disabled = true;
        try { await act(btn); } catch (e) { say(e.message); } finally { btn.disabled = false; }
      });
    });
  }

  function reloadButton() {
    const btn = document.getElementById("skills-reload");
    if (!btn) return;
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      try {
        const reg = await call("POST", "/v1/skills/reload");
        document.getElementById("skills-version").textContent = reg.version;
        say(`Skill registry version ${reg.version}: every worker rescans its skills by its ` +
            "next turn.");
      } catch (e) { say(e.message); } finally { btn.disabled = false; }
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    jobButtons();
    reloadButton();
  });
})();
