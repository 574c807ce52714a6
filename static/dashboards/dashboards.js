/* Attune dashboards: each chart fetches its JSON endpoint and redraws on a timer, no page reload.
   Charts are <div class="chart" data-endpoint="..." data-chart="kind">; one fetch per endpoint
   feeds every chart that names it. The what-if run page polls its run until it is done. */
(function () {
  "use strict";

  var CONFIG = { responsive: true, displaylogo: false };
  var BASE_LAYOUT = { margin: { l: 55, r: 20, t: 40, b: 45 }, legend: { orientation: "h", y: -0.2 } };

  function layout(title, extra) {
    return Object.assign({}, BASE_LAYOUT, { title: { text: title, font: { size: 15 } } }, extra || {});
  }

  function isEmpty(values) {
    return !values || values.every(function (v) { return v === null || v === undefined; });
  }

  function noData(lay, empty) {
    if (empty) {
      lay.annotations = [{ text: "no data in this window", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }];
    }
    return lay;
  }

  function utilisation(kind, label) {
    return function (d) {
      var s = d[kind];
      return {
        traces: [
          { x: d.t, y: s.allocated_pct, name: "allocated", type: "scatter", mode: "lines", line: { shape: "hv" } },
          { x: d.t, y: s.measured_pct, name: "measured", type: "scatter", mode: "lines", connectgaps: false },
        ],
        layout: noData(layout(label + " utilisation (% of cluster)", { yaxis: { range: [0, 105], ticksuffix: "%" } }),
          isEmpty(s.allocated_pct.filter(function (v) { return v; })) && isEmpty(s.measured_pct)),
      };
    };
  }

  var RENDERERS = {
    "util-gpu": utilisation("gpu", "GPU"),
    "util-cpu": utilisation("cpu", "CPU"),
    "util-mem": utilisation("mem", "Memory"),
    "jct-cdf": function (d) {
      return {
        // A step that starts from 0 at the shortest JCT, as an empirical CDF does.
        traces: [{ x: d.cdf.jct_h.slice(0, 1).concat(d.cdf.jct_h), y: (d.jobs ? [0] : []).concat(d.cdf.fraction),
          type: "scatter", mode: "lines", line: { shape: "hv" }, name: "CDF" }],
        layout: noData(layout("JCT distribution (" + d.jobs + " completed jobs)", {
          xaxis: { title: { text: "job completion time (h)" } }, yaxis: { range: [0, 1.02], title: { text: "fraction of jobs" } },
        }), d.jobs === 0),
      };
    },
    "jct-week": function (d) {
      var traces = Object.keys(d.by_week.series).map(function (label) {
        var s = d.by_week.series[label];
        return { x: d.by_week.weeks, y: s.avg_jct_h, customdata: s.jobs, name: label, type: "bar",
          hovertemplate: "%{y:.2f} h over %{customdata} jobs<extra>" + label + "</extra>" };
      });
      return {
        traces: traces,
        layout: noData(layout("Average JCT by week and policy/allocator", {
          barmode: "group", xaxis: { title: { text: "week starting" }, type: "category" }, yaxis: { title: { text: "average JCT (h)" } },
        }), traces.length === 0),
      };
    },
    "qos-time": function (d) {
      return {
        traces: [{ x: d.t, y: d.rate_pct, customdata: d.decided, type: "scatter", mode: "lines+markers", name: "met",
          hovertemplate: "%{y:.1f}% of %{customdata} jobs<extra></extra>" }],
        layout: noData(layout("QoS guarantees met over time" + (d.overall_pct === null ? "" : " (overall " + d.overall_pct.toFixed(1) + "%)"),
          { yaxis: { range: [0, 105], ticksuffix: "%" } }), isEmpty(d.rate_pct)),
      };
    },
    "qos-team": function (d) {
      var t = d.teams;
      return {
        traces: [{ x: t.team, y: t.rate_pct, type: "bar", name: "met",
          text: t.met.map(function (m, i) { return m + "/" + t.decided[i]; }), textposition: "auto" }],
        layout: noData(layout("QoS guarantees met per team", { yaxis: { range: [0, 105], ticksuffix: "%" }, xaxis: { type: "category" } }),
          t.team.length === 0),
      };
    },
    "admission-time": function (d) {
      var o = d.overall;
      var title = "Finish error of admission forecasts (h)";
      if (o.jobs) {
        title += " (" + o.jobs + " jobs, median " + o.median_abs_error_h.toFixed(2) + " h" +
          (o.verdicts_right_pct === null ? "" : ", verdict right " + o.verdicts_right_pct.toFixed(0) + "%") + ")";
      }
      return {
        traces: [
          { x: d.t, y: d.median_abs_error_h, customdata: d.jobs, name: "median |error|", type: "scatter", mode: "lines+markers",
            hovertemplate: "%{y:.2f} h over %{customdata} jobs<extra></extra>" },
          { x: d.t, y: d.mean_error_h, name: "mean error (late > 0)", type: "scatter", mode: "lines", line: { dash: "dot" } },
        ],
        layout: noData(layout(title, { yaxis: { zeroline: true } }), isEmpty(d.median_abs_error_h)),
      };
    },
    "admission-workload": function (d) {
      var w = d.workloads;
      return {
        traces: [{ x: w.workload, y: w.median_abs_error_h, type: "bar", name: "median |error|",
          customdata: w.workload.map(function (_, i) {
            var fixed = function (v) { return v === null ? "-" : v.toFixed(2); };
            return [w.jobs[i], fixed(w.speed_correction[i]), fixed(w.placement_penalty[i])];
          }),
          hovertemplate: "%{y:.2f} h over %{customdata[0]} jobs, speed correction %{customdata[1]}, " +
            "placement penalty %{customdata[2]}<extra></extra>" }],
        layout: noData(layout("Median finish error per workload (h)", { xaxis: { type: "category" } }), w.workload.length === 0),
      };
    },
    "queue": function (d) {
      return {
        traces: [
          { x: d.t, y: d.avg_waiting, name: "waiting (mean)", type: "scatter", mode: "lines" },
          { x: d.t, y: d.max_waiting, name: "waiting (peak)", type: "scatter", mode: "lines", line: { dash: "dot" } },
          { x: d.t, y: d.avg_running, name: "running (mean)", type: "scatter", mode: "lines" },
        ],
        layout: noData(layout("Queue length after each round (jobs)", { yaxis: { rangemode: "tozero" } }), isEmpty(d.avg_waiting)),
      };
    },
  };

  function setStatus(text, isError) {
    var el = document.getElementById("dash-status");
    if (el) {
      el.textContent = text;
      el.classList.toggle("dash-error", !!isError);
    }
  }

  function fetchJson(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(function (r) {
      if (!r.ok) { throw new Error(url + ": HTTP " + r.status); }
      return r.json();
    });
  }

  function refreshCharts() {
    var charts = Array.prototype.slice.call(document.querySelectorAll(".chart[data-endpoint]"));
    if (!charts.length) { return; }
    var select = document.getElementById("dash-days");
    var days = select ? select.value : "7";
    var byEndpoint = {};
    charts.forEach(function (el) { (byEndpoint[el.dataset.endpoint] = byEndpoint[el.dataset.endpoint] || []).push(el); });
    var jobs = Object.keys(byEndpoint).map(function (endpoint) {
      return fetchJson(endpoint + "?days=" + encodeURIComponent(days)).then(function (data) {
        byEndpoint[endpoint].forEach(function (el) {
          var figure = RENDERERS[el.dataset.chart](data);
          Plotly.react(el, figure.traces, figure.layout, CONFIG);
        });
      });
    });
    Promise.all(jobs).then(function () {
      setStatus("updated " + new Date().toLocaleTimeString());
    }).catch(function (err) {
      setStatus("could not update: " + err.message, true);
    });
  }

  /* ---- what-if run page ---- */

  var METRICS = [["avg_jct_h", "Average JCT (h)"], ["p99_jct_h", "p99 JCT (h)"], ["makespan_h", "Makespan (h)"]];

  function drawWhatIf(run) {
    var labels = run.runs.map(function (r) { return r.policy + "/" + r.allocator; });
    METRICS.forEach(function (m) {
      var el = document.querySelector('.whatif-chart[data-metric="' + m[0] + '"]');
      if (!el) { return; }
      var traces = [{ x: labels, y: run.runs.map(function (r) { return r[m[0]]; }), type: "bar", name: "simulated",
        text: run.runs.map(function (r) { return r[m[0]] === null ? "" : r[m[0]].toFixed(2); }), textposition: "auto" }];
      if (run.actual && run.actual[m[0]] !== undefined && run.actual[m[0]] !== null) {
        traces.push({ x: ["recorded (what happened)"], y: [run.actual[m[0]]], type: "bar", name: "recorded",
          text: [run.actual[m[0]].toFixed(2)], textposition: "auto" });
      }
      Plotly.react(el, traces, layout(m[1], { xaxis: { type: "category" }, showlegend: !!run.actual }), CONFIG);
    });
    var body = document.getElementById("whatif-table-body");
    if (body) {
      body.innerHTML = "";
      var rows = run.runs.map(function (r) { return [r.policy + "/" + r.allocator, r]; });
      if (run.actual) { rows.push(["recorded (what happened)", run.actual]); }
      rows.forEach(function (row) {
        var tr = document.createElement("tr");
        var cells = [row[0]].concat(["avg_jct_h", "median_jct_h", "p99_jct_h", "makespan_h", "qos_pct"].map(function (k) {
          var v = row[1][k];
          return v === null || v === undefined ? "–" : Number(v).toFixed(2);
        }));
        cells.forEach(function (c) { var td = document.createElement("td"); td.textContent = c; tr.appendChild(td); });
        body.appendChild(tr);
      });
    }
  }

  function pollWhatIf(el) {
    var bar = document.getElementById("whatif-progress");
    var statusEl = document.getElementById("whatif-status");
    function tick() {
      fetchJson(el.dataset.endpoint).then(function (run) {
        if (bar) { bar.value = run.progress; }
        if (statusEl) { statusEl.textContent = run.status + " · " + Math.round(100 * run.progress) + "%"; }
        if (run.status === "SUCCEEDED") {
          drawWhatIf(run);
          el.classList.add("whatif-done");
        } else if (run.status === "FAILED") {
          var err = document.getElementById("whatif-error");
          if (err) { err.textContent = run.error; err.hidden = false; }
        } else {
          window.setTimeout(tick, 1000);
        }
      }).catch(function (err) {
        if (statusEl) { statusEl.textContent = "could not update: " + err.message; }
        window.setTimeout(tick, 5000);
      });
    }
    tick();
  }

  function start() {
    var run = document.getElementById("whatif-run");
    if (run) { pollWhatIf(run); }
    var root = document.querySelector("[data-refresh-s]");
    if (!root) { return; }
    refreshCharts();
    var select = document.getElementById("dash-days");
    if (select) { select.addEventListener("change", refreshCharts); }
    window.setInterval(refreshCharts, 1000 * Number(root.dataset.refreshS || 30));
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
