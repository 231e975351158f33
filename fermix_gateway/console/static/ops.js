// The console's audit and usage views: the chain's check, the chart's bars, and (for admins)
// setting and clearing budgets through /v1 with the session's CSRF token. Text only ever goes
// into textContent; sizes are set through the CSSOM (the CSP allows no inline style).
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

  function verifyButton() {
    const btn = document.getElementById("verify");
    if (!btn) return;
    const out = document.getElementById("verify-result");
    btn.addEventListener("click", async () => {
      btn.disabled = true;
      out.textContent = "checking…";
      delete out.dataset.ok;
      try {
        const v = await call("GET", "/v1/audit/verify");
        out.textContent = v.ok ? `Chain OK: ${v.checked} entries checked.`
                               : `Chain BROKEN: ${v.problem}`;
        out.dataset.ok = v.ok ? "yes" : "no";
      } catch (e) {
        out.textContent = "";
        say(e.message);
      } finally { btn.disabled = false; }
    });
  }

  function bars() {
    document.querySelectorAll(".chart .bar[data-pct]").forEach((el) => {
      const pct = Math.max(0, Math.min(100, Number(el.dataset.pct) || 0));
      el.style.height = `${pct}%`;
      if (pct > 0 && pct < 1) el.style.minHeight = "1px";
    });
    document.querySelectorAll("td.time[data-ms]").forEach((el) => {
      const ms = Number(el.dataset.ms);
      if (ms) el.textContent = new Date(ms).toLocaleString();
    });
  }

  function budgetForm() {
    const form = document.getElementById("budget-set");
    if (!form) return;
    form.addEventListener("submit", async (e) => {
      e.preventDefault();
      const body = {
        scope: document.getElementById("b-scope").value.trim(),
        period: document.getElementById("b-period").value,
        usd: Number(document.getElementById("b-usd").value),
      };
      const btn = document.getElementById("budget-save");
      btn.disabled = true;
      try {
        await call("PUT", "/v1/budgets", body);
        window.location.reload();
      } catch (err) { say(err.message); btn.disabled = false; }
    });
  }

  function clearButtons() {
    document.querySelectorAll("button.budget-clear").forEach((btn) => {
      btn.addEventListener("click", async () => {
        btn.disabled = true;
        const q = new URLSearchParams({ scope: btn.dataset.scope, period: btn.dataset.period });
        try {
          await call("DELETE", `/v1/budgets?${q}`);
          btn.closest("tr").remove();
          say(`Cleared the ${btn.dataset.period} budget on ${btn.dataset.scope}.`);
        } catch (err) { say(err.message); btn.disabled = false; }
      });
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    verifyButton();
    bars();
    budgetForm();
    clearButtons();
  });
})();
