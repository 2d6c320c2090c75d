// The AceMQ console's only script: sortable tables, the header filter, live queue counts
// and rate sparklines, and a job's progress, all over the console's own endpoints.
// Hand-written, no framework, no build step. Text is only ever set with textContent.
"use strict";

(function () {
  const base = document.body.dataset.base || "/acemq-console";

  // Tables that sort: click a column header; numbers (or data-sort) sort as numbers.
  function cellValue(td) {
    const s = td.dataset.sort !== undefined ? td.dataset.sort : td.textContent.trim();
    const n = parseFloat(s.replace(/[^0-9.+-]/g, ""));
    return /^[-+]?[0-9]/.test(s) && !Number.isNaN(n) ? n : s.toLowerCase();
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    const ths = table.querySelectorAll("thead th");
    ths.forEach(function (th, i) {
      th.addEventListener("click", function () {
        const asc = !th.classList.contains("sorted-asc");
        ths.forEach(function (o) { o.classList.remove("sorted-asc", "sorted-desc"); });
        th.classList.add(asc ? "sorted-asc" : "sorted-desc");
        const body = table.tBodies[0];
        const rows = Array.from(body.rows);
        rows.sort(function (a, b) {
          const x = cellValue(a.cells[i]), y = cellValue(b.cells[i]);
          return (x < y ? -1 : x > y ? 1 : 0) * (asc ? 1 : -1);
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });

  // Headers filterable by key or value.
  const hf = document.getElementById("header-filter");
  if (hf) {
    hf.addEventListener("input", function () {
      const q = hf.value.toLowerCase();
      document.querySelectorAll("#headers tbody tr").forEach(function (tr) {
        tr.hidden = q !== "" && !tr.textContent.toLowerCase().includes(q);
      });
    });
  }

  // Live counts: every element with data-q (queue) and data-f (field) is kept current.
  const history = {};
  function fmt(field, v) {
    if (v === null || v === undefined) return "–";
    if (field.endsWith("_rate")) return v.toFixed(1) + "/s";
    return String(v);
  }
  function spark(el, values) {
    const w = 80, h = 18, max = Math.max(1, ...values);
    const pts = values.map(function (v, i) {
      return (i * w / Math.max(1, values.length - 1)).toFixed(1) + "," + (h - v / max * (h - 2) - 1).toFixed(1);
    }).join(" ");
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("width", w); svg.setAttribute("height", h);
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", pts); line.setAttribute("fill", "none");
    line.setAttribute("stroke", "#2456d6"); line.setAttribute("stroke-width", "1.5");
    svg.appendChild(line);
    el.replaceChildren(svg);
    el.title = "publish rate, last " + values.length + " samples";
  }
  if (document.querySelector("[data-q]") && window.EventSource) {
    const es = new EventSource(base + "/events");
    es.addEventListener("queues", function (e) {
      const list = JSON.parse(e.data);
      if (!Array.isArray(list)) return;
      list.forEach(function (q) {
        document.querySelectorAll("[data-f]").forEach(function (el) {
          if (el.dataset.q === q.name && el.dataset.f in q) el.textContent = fmt(el.dataset.f, q[el.dataset.f]);
        });
        const h = history[q.name] = (history[q.name] || []).concat([(q.publish_rate || 0) + (q.deliver_rate || 0)]).slice(-30);
        document.querySelectorAll(".spark").forEach(function (el) {
          if (el.dataset.q === q.name && h.length > 1) spark(el, h);
        });
      });
    });
  }

  // A job's progress, then its summary.
  const job = document.getElementById("job");
  if (job && window.EventSource) {
    const es = new EventSource(job.dataset.events);
    es.addEventListener("job", function (e) {
      const j = JSON.parse(e.data);
      ["status", "scanned", "moved", "declined", "failed"].forEach(function (k) {
        const el = document.getElementById(k);
        if (el) el.textContent = String(j[k]);
      });
      const bar = document.getElementById("bar");
      if (bar) {
        if (j.total) bar.max = j.total;
        bar.value = j.status === "running" ? j.scanned : bar.max;
      }
      if (j.error) document.getElementById("job-error").textContent = j.error;
      if (j.status !== "running") es.close();
    });
  }
})();
