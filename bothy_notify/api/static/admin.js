// Bothy Notify status page: reads GET /v1/admin/status every 2 s with an operator
// token (scope admin:read) kept in this tab's sessionStorage. Plain DOM, no
// framework; every value is written with textContent, never as HTML.
"use strict";

(() => {
  const KEY = "bothy.admin.token";
  const REFRESH_MS = 2000;
  const OUTCOMES = ["delivered", "transient", "rejected", "mismatch", "dead"];
  const MATRIX_OUTCOMES = ["delivered", "rejected", "refused", "pending", "duplicate"];
  const $ = (id) => document.getElementById(id);
  let timer = null;
  let busy = false;
  let last = null;

  const token = () => sessionStorage.getItem(KEY) || "";

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (token()) h.authorization = "Bearer " + token();
    return h;
  }

  function say(text, kind) {
    const box = $("message");
    box.textContent = text;
    box.className = "message" + (kind ? " " + kind : "");
    box.hidden = !text;
  }

  function showLogin(text) {
    stop();
    $("login").hidden = false;
    $("status").hidden = true;
    $("forget").hidden = !token();
    $("updated").textContent = "not connected";
    say(text);
    $("token").focus();
  }

  function showStatus() {
    $("login").hidden = true;
    $("status").hidden = false;
    $("forget").hidden = false;
  }

  function start() {
    stop();
    refresh();
    timer = setInterval(refresh, REFRESH_MS);
  }

  function stop() {
    if (timer !== null) clearInterval(timer);
    timer = null;
  }

  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "–";
    if (seconds < 1) return Math.round(seconds * 1000) + " ms";
    if (seconds < 90) return seconds.toFixed(1) + " s";
    if (seconds < 5400) return Math.round(seconds / 60) + " min";
    if (seconds < 172800) return (seconds / 3600).toFixed(1) + " h";
    return Math.round(seconds / 86400) + " d";
  }

  function cell(text, className) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "–" : String(text);
    if (className) td.className = className;
    return td;
  }

  function fill(id, rows, emptyText, columns) {
    const body = $(id).tBodies[0];
    const out = rows.map((row) => {
      const tr = document.createElement("tr");
      for (const c of row) tr.appendChild(c instanceof Node ? c : cell(c));
      return tr;
    });
    if (out.length === 0) {
      const tr = document.createElement("tr");
      const td = cell(emptyText, "empty");
      td.colSpan = columns;
      tr.appendChild(td);
      out.push(tr);
    }
    body.replaceChildren(...out);
  }

  function yesNo(value, yes, no) {
    return cell(value ? yes : no, value ? "yes" : "no");
  }

  function render(s) {
    last = s;
    showStatus();
    $("node-count").textContent = String(s.nodes.length);
    fill(
      "nodes",
      s.nodes.map((n) => {
        const name = cell(n.node_id.slice(0, 8));
        name.title = n.node_id;
        if (n.this) {
          const mark = document.createElement("span");
          mark.className = "this";
          mark.textContent = "this node";
          name.appendChild(mark);
        }
        const row = [
          name,
          n.role,
          duration(n.heartbeat_age_seconds) + " ago",
          yesNo(n.ready, "ready", "not ready"),
          n.holds_round ? cell("holds the round", "yes") : cell("–"),
          cell(n.connections.connecting, "num"),
          cell(n.connections.catching_up, "num"),
          cell(n.connections.live, "num"),
          cell(n.connections.closing, "num"),
          cell(n.events_decided, "num"),
        ];
        return row;
      }),
      "no live node",
      10,
    );
    $("lag-events").textContent = String(s.consumer.lag_events);
    $("lag-seconds").textContent = duration(s.consumer.lag_seconds);
    $("lag-seconds").className = s.consumer.lag_seconds > 10 ? "warn" : "";
    $("events-decided").textContent = String(s.consumer.events_decided);
    $("connections-live").textContent = String(s.connections.live || 0);

    fill(
      "skips",
      Object.entries(s.skips)
        .sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]))
        .map(([reason, n]) => [reason, cell(n, "num")]),
      "none",
      2,
    );
    fill(
      "jobs",
      s.jobs.map((j) => [j.kind, j.state, cell(j.count, "num"), cell(j.due, "num"), duration(j.oldest_due_seconds)]),
      "no unfinished job",
      5,
    );
    $("window").textContent = "sends in the last " + Math.round(s.window_seconds / 60) + " minutes";
    const providerRows = [];
    for (const p of s.providers) {
      const apps = p.apps.length ? p.apps : [{ app: null, sends: {}, sent: 0, last_error: null }];
      for (const a of apps) {
        const error = a.last_error ? a.last_error + " (" + duration(a.last_error_seconds) + " ago)" : "–";
        providerRows.push([
          p.provider,
          a.app === null ? "–" : a.app,
          cell(a.sent, "num"),
          ...OUTCOMES.map((o) => cell(a.sends[o] || 0, "num")),
          cell(p.in_flight, "num"),
          cell(error, a.last_error ? "warn" : ""),
        ]);
      }
    }
    fill("providers", providerRows, "no provider configured", 10);

    const matrix = s.matrix || { apps: [], requests: {} };
    $("matrix-card").hidden = matrix.apps.length === 0;
    $("matrix-requests").textContent =
      "since the nodes started: " +
      Object.entries(matrix.requests)
        .sort()
        .map(([answer, n]) => n + " " + answer.replace("_", " "))
        .join(", ");
    fill(
      "matrix",
      matrix.apps.map((a) => [
        a.app,
        cell(a.devices, "num"),
        ...MATRIX_OUTCOMES.map((o) => cell(a.outcomes[o] || 0, o === "rejected" && a.outcomes[o] ? "warn" : "num")),
      ]),
      "no notify request yet",
      7,
    );

    const byProvider = {};
    for (const r of s.registrations) {
      byProvider[r.provider] = byProvider[r.provider] || { active: 0, invalidated: 0 };
      byProvider[r.provider][r.state] = r.count;
    }
    fill(
      "registrations",
      Object.keys(byProvider)
        .sort()
        .map((p) => [p, cell(byProvider[p].active, "num"), cell(byProvider[p].invalidated, "num")]),
      "none",
      3,
    );

    const dead = s.dead_letters;
    $("dead-count").textContent = String(dead.count);
    fill(
      "dead-letters",
      dead.types.map((t) => [t.type, cell(t.count, "num"), duration(t.newest_seconds) + " ago", actions(t.type)]),
      "none: every event was decided",
      4,
    );
    $("dead-actions").hidden = dead.count === 0;
    $("updated").textContent = "updated " + new Date(s.generated_at).toLocaleTimeString();
  }

  function actions(type) {
    const td = document.createElement("td");
    const box = document.createElement("div");
    box.className = "actions";
    for (const [action, label] of [["retry", "Retry"], ["discard", "Discard"]]) {
      const b = document.createElement("button");
      b.type = "button";
      b.textContent = label;
      b.dataset.action = action;
      b.dataset.type = type;
      if (action === "discard") b.className = "danger";
      box.appendChild(b);
    }
    td.appendChild(box);
    return td;
  }

  async function refresh() {
    if (busy) return;
    busy = true;
    try {
      const answer = await fetch("/v1/admin/status", { headers: headers(), cache: "no-store" });
      if (answer.status === 401) {
        const had = token();
        sessionStorage.removeItem(KEY); // refused for good: a reload asks again
        showLogin(
          had
            ? "The daemon refused this token (401 unauthorized): it is malformed, expired, or not signed by a key of auth.keys. Paste a new operator token."
            : "This page needs an operator token: without one the daemon answers 401 unauthorized. Paste a token with scope admin:read below.",
        );
        return;
      }
      if (answer.status === 403) {
        sessionStorage.removeItem(KEY);
        showLogin("This token is valid but lacks scope admin:read (403 forbidden). Paste an operator token.");
        return;
      }
      if (!answer.ok) {
        say(
          answer.status === 503
            ? "The daemon cannot reach its database right now (503); the figures below are the last ones read."
            : "The status could not be read (HTTP " + answer.status + "); trying again.",
        );
        return;
      }
      render(await answer.json());
      say("");
    } catch (error) {
      say("The daemon cannot be reached; trying again every 2 s." + (last ? " The figures below are the last ones read." : ""));
    } finally {
      busy = false;
    }
  }

  async function act(action, type) {
    const what = type ? "the dead letters of type " + type : "every dead letter";
    if (action === "discard" && !window.confirm("Discard " + what + "? Their events stay in the log, but the round will never decide them.")) {
      return;
    }
    const answer = await fetch("/v1/admin/dead-letters/" + action, {
      method: "POST",
      headers: headers({ "content-type": "application/json" }),
      body: JSON.stringify(type ? { type } : {}),
    });
    if (answer.status === 403) {
      say("Retrying or discarding dead letters needs a token with scope admin:write (403 forbidden).");
      return;
    }
    if (!answer.ok) {
      say("The " + action + " failed (HTTP " + answer.status + ").");
      return;
    }
    const result = await answer.json();
    $("dead-note").textContent =
      action === "retry"
        ? result.replayed + " replayed, " + result.failed + " failed again, " + result.remaining + " left"
        : result.discarded + " discarded, " + result.remaining + " left";
    refresh();
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const value = $("token").value.trim();
      if (!value) return;
      sessionStorage.setItem(KEY, value);
      $("token").value = "";
      say("");
      start();
    });
    $("forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY);
      showLogin("Token forgotten. Paste an operator token to see the status again.");
    });
    $("status").addEventListener("click", (event) => {
      const button = event.target.closest("button[data-action]");
      if (button) act(button.dataset.action, button.dataset.type || "");
    });
    start();
  });
})();
