// The admin UI's one script: no library, no build step. It reads and acts
// through the JSON API (api/...) and writes text with textContent only,
// never innerHTML, so no stored value can become markup.
(function () {
  "use strict";
  var meta = function (name) {
    var m = document.querySelector('meta[name="' + name + '"]');
    return m ? m.getAttribute("content") : "";
  };
  var base = meta("base") || "/";
  var csrf = meta("csrf-token");
  var params = new URLSearchParams(window.location.search);

  function api(method, path, body) {
    var opts = { method: method, credentials: "same-origin", headers: { "Accept": "application/json" } };
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.headers["X-CSRF-Token"] = csrf;
      opts.body = JSON.stringify(body);
    }
    return fetch(base + path, opts).then(function (r) {
      return r.json().then(function (j) {
        if (!r.ok) { throw new Error(j.error || ("HTTP " + r.status)); }
        return j;
      });
    });
  }

  function fmt(n) { return Number(n).toLocaleString("en-US"); }

  // Overview: refresh the numbers and the chart from api/overview.
  var chartW = 600, chartH = 120;
  function points(series, top) {
    return series.map(function (v, i) {
      var x = i * chartW / Math.max(series.length - 1, 1);
      var y = chartH - v * (chartH - 4) / Math.max(top, 1);
      return x.toFixed(1) + "," + y.toFixed(1);
    }).join(" ");
  }
  function refreshOverview() {
    api("GET", "api/overview").then(function (ov) {
      ov.tables.forEach(function (t) {
        var card = Array.prototype.find.call(document.querySelectorAll("section[data-table]"), function (s) {
          return s.getAttribute("data-table") === t.table;
        });
        if (!card) { return; }
        var set = function (field, text) {
          var el = card.querySelector('[data-field="' + field + '"]');
          if (el) { el.textContent = text; }
        };
        var s = t.status;
        set("backlog", fmt(s.backlog) + (s.backlog_capped ? "+" : ""));
        set("oldest", s.oldest_created_at ? Math.round(s.oldest_age_seconds) + "s" : "none");
        set("published_rate", s.published_per_second.toFixed(1));
        set("written_rate", s.written_per_second.toFixed(1));
        set("parked", fmt(s.parked));
        var top = Math.max(1, Math.max.apply(null, t.chart.published.concat(t.chart.parked)));
        set("peak", fmt(top));
        card.querySelector('[data-series="published"]').setAttribute("points", points(t.chart.published, top));
        card.querySelector('[data-series="parked"]').setAttribute("points", points(t.chart.parked, top));
      });
    }).catch(function () { /* keep the last numbers */ });
  }

  // Confirmation panel and progress of an action.
  var panel = document.getElementById("confirm");
  var text = document.getElementById("confirm-text");
  var status = document.getElementById("confirm-status");
  var bar = document.getElementById("confirm-progress");
  var yes = document.getElementById("confirm-yes");
  var no = document.getElementById("confirm-no");
  var pending = null;

  function showPanel(msg) {
    text.textContent = msg;
    status.textContent = "";
    bar.hidden = true;
    yes.hidden = false;
    yes.disabled = false;
    no.textContent = "Cancel";
    panel.hidden = false;
  }
  no.addEventListener("click", function () { panel.hidden = true; pending = null; });

  function currentFilter() {
    return {
      topic: params.get("topic") || "", type: params.get("type") || "", key: params.get("key") || "",
      event_id: params.get("event_id") || "", reason: params.get("reason") || ""
    };
  }
  function currentInboxFilter(box) {
    return {
      consumer: box.getAttribute("data-consumer") || "", topic: box.getAttribute("data-topic") || "",
      error_type: box.getAttribute("data-error-type") || "", event_id: box.getAttribute("data-event-id") || ""
    };
  }
  function picked() {
    return Array.prototype.map.call(document.querySelectorAll("input.pick:checked"), function (c) { return c.value; });
  }

  // request builds the ActionRequest of a button.
  function request(btn) {
    var inboxBox = btn.closest("[data-inbox]");
    var scope = btn.getAttribute("data-scope");
    var req = { action: btn.getAttribute("data-action"), filter: {}, inbox_filter: {} };
    if (inboxBox) {
      req.inbox = inboxBox.getAttribute("data-inbox");
      if (scope === "one") { req.ids = [Number(btn.getAttribute("data-id"))]; }
      if (scope === "selection") { req.ids = picked().map(Number); }
      if (scope === "matching") { req.matching = true; req.inbox_filter = currentInboxFilter(inboxBox); }
    } else {
      req.table = params.get("table") || "";
      if (scope === "one") { req.event_ids = [btn.getAttribute("data-id")]; }
      if (scope === "selection") { req.event_ids = picked(); }
      if (scope === "matching") { req.matching = true; req.filter = currentFilter(); }
      if (scope === "filter") {
        req.matching = true;
        req.filter = currentFilter();
        req.filter.topic = btn.getAttribute("data-topic") || "";
        req.filter.reason = btn.getAttribute("data-reason") || "";
        req.filter.event_id = "";
      }
    }
    if ((scope === "selection") && ((req.ids && !req.ids.length) || (req.event_ids && !req.event_ids.length))) {
      return null;
    }
    return req;
  }

  function poll(job, after) {
    bar.hidden = false;
    bar.max = Math.max(job.total, 1);
    bar.value = job.done;
    status.textContent = job.action + ": " + fmt(job.done) + " of " + fmt(job.total) + " (" + job.state + ")";
    if (job.state === "running") {
      setTimeout(function () {
        api("GET", "api/jobs/" + encodeURIComponent(job.id)).then(function (j) { poll(j, after); })
          .catch(function (e) { status.textContent = "Error: " + e.message; });
      }, 250);
      return;
    }
    if (job.state === "failed") {
      status.textContent = job.action + " failed after " + fmt(job.done) + ": " + job.error;
    } else {
      status.textContent = "Done: " + fmt(job.done) + " " + job.action + (job.action.slice(-1) === "e" ? "d" : "ed") + ".";
    }
    no.textContent = "Close";
    setTimeout(after, 700);
  }

  document.addEventListener("click", function (ev) {
    var btn = ev.target.closest("button.act");
    if (!btn) { return; }
    var req = request(btn);
    if (!req) { showPanel("Select rows first."); yes.hidden = true; return; }
    api("POST", "api/count", req).then(function (c) {
      var what = req.inbox ? "parked records" : (req.action === "replay" ? "published events" : "parked events");
      showPanel(req.action.charAt(0).toUpperCase() + req.action.slice(1) + " " + fmt(c.count) + " " + what + " (" + c.filter + ") in " + c.table + "?");
      if (c.count === 0) { yes.hidden = true; }
      pending = { req: req, scope: btn.getAttribute("data-scope") };
    }).catch(function (e) { showPanel("Error: " + e.message); yes.hidden = true; });
  });

  yes.addEventListener("click", function () {
    if (!pending) { return; }
    var p = pending;
    pending = null;
    yes.disabled = true;
    api("POST", "api/actions", p.req).then(function (job) {
      poll(job, function () {
        if (p.scope === "one" && p.req.action === "delete") {
          window.location.assign(base + (p.req.inbox ? "inbox?inbox=" + encodeURIComponent(p.req.inbox) : "parked?table=" + encodeURIComponent(p.req.table)));
        } else {
          window.location.reload();
        }
      });
    }).catch(function (e) { status.textContent = "Error: " + e.message; yes.disabled = false; });
  });

  // Parked list: "Next page" appends the next keyset page from the page's
  // twin (api/parked) instead of loading a new page; without the script the
  // link still works.
  var canOperate = document.body.getAttribute("data-can-operate") === "true";
  function ago(iso) {
    var s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
    if (s < 60) { return Math.floor(s) + "s ago"; }
    if (s < 3600) { return Math.floor(s / 60) + "m ago"; }
    if (s < 172800) { return Math.floor(s / 3600) + "h ago"; }
    return Math.floor(s / 86400) + "d ago";
  }
  function cell(tr, text, cls) {
    var td = document.createElement("td");
    if (cls) { td.className = cls; }
    td.textContent = text;
    tr.appendChild(td);
    return td;
  }
  function parkedRow(e, table) {
    var tr = document.createElement("tr");
    tr.className = "event";
    if (canOperate) {
      var box = document.createElement("input");
      box.type = "checkbox";
      box.className = "pick";
      box.value = e.event_id;
      box.setAttribute("aria-label", "select");
      cell(tr, "").appendChild(box);
    }
    cell(tr, String(e.id), "n");
    var a = document.createElement("a");
    a.className = "event-link";
    a.href = base + "event?" + new URLSearchParams({ table: table, id: e.event_id }).toString();
    var code = document.createElement("code");
    code.textContent = e.event_id;
    a.appendChild(code);
    cell(tr, "").appendChild(a);
    cell(tr, e.event_type);
    cell(tr, e.topic);
    cell(tr, e.key, "key");
    cell(tr, String(e.attempts), "n");
    cell(tr, e.last_error, "reason");
    cell(tr, ago(e.parked_at)).title = e.parked_at;
    return tr;
  }
  var next = document.getElementById("next");
  if (next && document.body.getAttribute("data-page") === "parked") {
    next.addEventListener("click", function (ev) {
      ev.preventDefault();
      var q = new URL(next.href, window.location.href).searchParams;
      api("GET", "api/parked?" + q.toString()).then(function (pp) {
        var body = document.querySelector("#events tbody");
        pp.events.forEach(function (e) { body.appendChild(parkedRow(e, pp.table)); });
        if (pp.next) {
          q.set("after", String(pp.next));
          next.href = base + "parked?" + q.toString();
        } else {
          next.remove();
        }
      }).catch(function (e) { next.textContent = "Next page (" + e.message + ")"; });
    });
  }

  // Event: its state, attempts and last error follow api/event, so a relay
  // publishing a requeued event shows.
  function refreshEvent() {
    api("GET", "api/event?" + params.toString()).then(function (ep) {
      var e = ep.event;
      var st = document.getElementById("state");
      st.textContent = e.state;
      st.className = "state state-" + e.state;
      document.getElementById("attempts").textContent = String(e.attempts);
      document.getElementById("last-error").textContent = e.last_error || "none";
    }).catch(function () { /* deleted, or the database is away: keep the page */ });
  }

  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("input.pick").forEach(function (c) { c.checked = all.checked; });
    });
  }

  if (document.body.getAttribute("data-page") === "overview") {
    setInterval(refreshOverview, 10000);
  }
  if (document.body.getAttribute("data-page") === "event") {
    setInterval(refreshEvent, 5000);
  }
})();
