// Live counts: every few seconds, fetch /api/overview and update the numbers in place.
// Plain DOM (textContent only, never HTML); the pages work without it.
(function () {
  "use strict";
  var body = document.body;
  var url = body.getAttribute("data-overview-url");
  var every = parseInt(body.getAttribute("data-refresh-ms"), 10) || 3000;

  function pick(data, path) {
    return path.split(".").reduce(function (v, k) { return v == null ? v : v[k]; }, data);
  }
  function show(value) { return value === null || value === undefined ? "n/a" : String(value); }
  function age(s) {
    if (s === null || s === undefined) { return "n/a"; }
    if (s < 120) { return s.toFixed(1) + " s"; }
    if (s < 7200) { return (s / 60).toFixed(1) + " min"; }
    if (s < 172800) { return (s / 3600).toFixed(1) + " h"; }
    return (s / 86400).toFixed(1) + " d";
  }
  function update(data) {
    var queues = {};
    (data.status.queues || []).forEach(function (q) { queues[q.name] = q; });
    document.querySelectorAll("[data-queue]").forEach(function (row) {
      var q = queues[row.getAttribute("data-queue")];
      var r = (data.rates.queues || {})[row.getAttribute("data-queue")] || {};
      if (!q) { return; }
      row.querySelectorAll("[data-field]").forEach(function (cell) {
        cell.textContent = show(q[cell.getAttribute("data-field")]);
      });
      row.querySelectorAll("[data-rate]").forEach(function (cell) {
        cell.textContent = show(r[cell.getAttribute("data-rate")]);
      });
    });
    document.querySelectorAll("[data-live]").forEach(function (el) {
      el.textContent = show(pick(data, el.getAttribute("data-live")));
    });
    document.querySelectorAll("[data-live-age]").forEach(function (el) {
      el.textContent = age(pick(data, el.getAttribute("data-live-age")));
    });
    document.querySelectorAll("[data-live-flag]").forEach(function (el) {
      el.textContent = pick(data, el.getAttribute("data-live-flag")) ? "healthy" : "not healthy";
    });
    var notes = document.getElementById("rate-notes");
    if (notes && data.rates && data.rates.notes) {
      notes.textContent = "";
      data.rates.notes.forEach(function (note) {
        var item = document.createElement("li");
        item.textContent = note;
        notes.appendChild(item);
      });
    }
    body.setAttribute("data-refreshed", String(Date.now()));
  }
  function poll() {
    fetch(url, { credentials: "same-origin", headers: { "Accept": "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) { if (data) { update(data); } })
      .catch(function () { /* the next poll tries again */ })
      .then(function () { window.setTimeout(poll, every); });
  }
  if (url && document.querySelector("[data-queue], [data-live]")) {
    window.setTimeout(poll, every);
  }
}());
