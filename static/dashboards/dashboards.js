/* Attune dashboards: each chart fetches its JSON endpoint and redraws on a timer, no page reload.
   Charts are <div class="chart" data-endpoint="..." data-chart="kind">; one fetch per endpoint
   feeds every chart that names it, over the window chosen in #dash-window, which the page's URL
   keeps (?window=6h). Durations read "42 s", "7 min", "3.2 h", "2.1 d". The what-if run page polls
   its run until it is done. */
(function () {
  "use strict";

  /* ---- durations: the same rules as scheduler_app/durations.py (the browser test compares them) ---- */

  var DURATION_UNITS = [[1, "s", 60], [60, "min", 60], [3600, "h", 24], [86400, "d", Infinity]];
  var MISSING = "\u2013";

  function rounded(v) {  // half up; one decimal below 10, whole numbers above
    return v < 10 ? Math.floor(v * 10 + 0.5) / 10 : Math.floor(v + 0.5);
  }

  function durationUnit(seconds) {  // [seconds per unit, name]: the unit formatDuration writes `seconds` in
    var size = Math.abs(seconds);
    for (var i = 0; i < DURATION_UNITS.length; i++) {
      if (rounded(size / DURATION_UNITS[i][0]) < DURATION_UNITS[i][2]) { return DURATION_UNITS[i]; }
    }
    return DURATION_UNITS[DURATION_UNITS.length - 1];
  }

  function formatDuration(seconds) {
    if (seconds === null || seconds === undefined || typeof seconds !== "number" || !isFinite(seconds)) { return MISSING; }
    var unit = durationUnit(seconds);
    var v = rounded(Math.abs(seconds) / unit[0]);
    return (v && seconds < 0 ? "-" : "") + String(v) + " " + unit[1];
  }

  function hoursText(h) { return h === null || h === undefined ? MISSING : formatDuration(h * 3600); }

  /* An axis of durations given in hours: the unit of its largest value, and the values in that unit. */
  function hoursAxis(lists) {
    var most = 0;
    lists.forEach(function (values) {
      values.forEach(function (v) { if (v !== null && v !== undefined) { most = Math.max(most, Math.abs(v)); } });
    });
    var unit = durationUnit(most * 3600);
    return {
      name: unit[1],
      scale: function (values) { return values.map(function (v) { return v === null || v === undefined ? null : v * 3600 / unit[0]; }); },
    };
  }

  /* Seconds per iteration: the same rules as format_iter_time in scheduler_app/durations.py. */
  function significant(v) { return v >= 100 ? String(Math.floor(v + 0.5)) : String(Number(v.toPrecision(3))); }

  function formatIterTime(seconds) {
    if (seconds === null || seconds === undefined || typeof seconds !== "number" || !isFinite(seconds) || seconds <= 0) { return MISSING; }
    var ms = significant(seconds * 1000);
    return Number(ms) < 1000 ? ms + " ms" : significant(seconds) + " s";
  }

  function pctText(v, signed) {
    return v === null || v === undefined ? MISSING : (signed && v > 0 ? "+" : "") + v.toFixed(1) + "%";
  }

  window.AttuneDashboards = { formatDuration: formatDuration, formatIterTime: formatIterTime };

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
      var xs = d.cdf.jct_h.slice(0, 1).concat(d.cdf.jct_h);
      var axis = hoursAxis([xs]);
      var title = "JCT distribution (" + d.jobs + " completed jobs" + (d.jobs ? ", median " + hoursText(d.p50_jct_h) : "") + ")";
      return {
        // A step that starts from 0 at the shortest JCT, as an empirical CDF does.
        traces: [{ x: axis.scale(xs), y: (d.jobs ? [0] : []).concat(d.cdf.fraction), customdata: xs.map(hoursText),
          type: "scatter", mode: "lines", line: { shape: "hv" }, name: "CDF",
          hovertemplate: "%{y:.0%} of jobs within %{customdata}<extra></extra>" }],
        layout: noData(layout(title, {
          xaxis: { title: { text: "job completion time (" + axis.name + ")" } }, yaxis: { range: [0, 1.02], title: { text: "fraction of jobs" } },
        }), d.jobs === 0),
      };
    },
    "jct-week": function (d) {
      var labels = Object.keys(d.by_week.series);
      var axis = hoursAxis(labels.map(function (label) { return d.by_week.series[label].avg_jct_h; }));
      var traces = labels.map(function (label) {
        var s = d.by_week.series[label];
        return { x: d.by_week.weeks, y: axis.scale(s.avg_jct_h), name: label, type: "bar",
          customdata: s.avg_jct_h.map(function (h, i) { return [hoursText(h), s.jobs[i]]; }),
          hovertemplate: "%{customdata[0]} over %{customdata[1]} jobs<extra>" + label + "</extra>" };
      });
      return {
        traces: traces,
        layout: noData(layout("Average JCT by week and policy/allocator", {
          barmode: "group", xaxis: { title: { text: "week starting" }, type: "category" },
          yaxis: { title: { text: "average JCT (" + axis.name + ")" } },
        }), traces.length === 0),
      };
    },
    "qos-time": function (d) {
      // The deadline kind and the minimum-rate kind apart: one promises a time, the other a speed.
      var rate = d.min_rate || { rate_pct: [], decided: [], overall_pct: null };
      var traces = [{ x: d.t, y: d.rate_pct, customdata: d.decided, type: "scatter", mode: "lines+markers", name: "deadline met",
        hovertemplate: "%{y:.1f}% of %{customdata} jobs<extra>deadline</extra>" }];
      if (rate.overall_pct !== null) {
        traces.push({ x: d.t, y: rate.rate_pct, customdata: rate.decided, type: "scatter", mode: "lines+markers",
          name: "minimum rate met", hovertemplate: "%{y:.1f}% of %{customdata} jobs<extra>minimum rate</extra>" });
      }
      var title = "QoS guarantees met over time" + (d.overall_pct === null ? "" : " (deadline " + d.overall_pct.toFixed(1) + "%") +
        (rate.overall_pct === null ? "" : (d.overall_pct === null ? " (" : ", ") + "minimum rate " + rate.overall_pct.toFixed(1) + "%") +
        (d.overall_pct === null && rate.overall_pct === null ? "" : ")");
      return {
        traces: traces,
        layout: noData(layout(title, { yaxis: { range: [0, 105], ticksuffix: "%" } }), isEmpty(d.rate_pct) && isEmpty(rate.rate_pct)),
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
      var title = "Finish error of admission forecasts";
      if (o.jobs) {
        title += " (" + o.jobs + " jobs, median " + hoursText(o.median_abs_error_h) +
          (o.verdicts_right_pct === null ? "" : ", verdict right " + o.verdicts_right_pct.toFixed(0) + "%") + ")";
      }
      var axis = hoursAxis([d.median_abs_error_h, d.mean_error_h]);
      return {
        traces: [
          { x: d.t, y: axis.scale(d.median_abs_error_h), name: "median |error|", type: "scatter", mode: "lines+markers",
            customdata: d.median_abs_error_h.map(function (h, i) { return [hoursText(h), d.jobs[i]]; }),
            hovertemplate: "%{customdata[0]} over %{customdata[1]} jobs<extra></extra>" },
          { x: d.t, y: axis.scale(d.mean_error_h), name: "mean error (late > 0)", type: "scatter", mode: "lines", line: { dash: "dot" },
            customdata: d.mean_error_h.map(hoursText), hovertemplate: "%{customdata}<extra>mean error</extra>" },
        ],
        layout: noData(layout(title, { yaxis: { zeroline: true, title: { text: axis.name } } }), isEmpty(d.median_abs_error_h)),
      };
    },
    "admission-workload": function (d) {
      var w = d.workloads;
      var axis = hoursAxis([w.median_abs_error_h]);
      return {
        traces: [{ x: w.workload, y: axis.scale(w.median_abs_error_h), type: "bar", name: "median |error|",
          customdata: w.workload.map(function (_, i) {
            var fixed = function (v) { return v === null ? "-" : v.toFixed(2); };
            return [hoursText(w.median_abs_error_h[i]), w.jobs[i], fixed(w.speed_correction[i]), fixed(w.placement_penalty[i])];
          }),
          hovertemplate: "%{customdata[0]} over %{customdata[1]} jobs, speed correction %{customdata[2]}, " +
            "placement penalty %{customdata[3]}<extra></extra>" }],
        layout: noData(layout("Median finish error per workload", { xaxis: { type: "category" }, yaxis: { title: { text: axis.name } } }),
          w.workload.length === 0),
      };
    },
    "restart-loss": function (d) {
      return {
        traces: [{ x: d.days, y: d.gpu_hours, type: "bar", name: "GPU-hours lost",
          hovertemplate: "%{y:.2f} GPU-hours<extra>%{x}</extra>" }],
        layout: noData(layout("GPU-hours lost to restarts per day (" + d.total_gpu_hours.toFixed(2) + " in all)", {
          xaxis: { type: "category", title: { text: "day" } }, yaxis: { rangemode: "tozero", title: { text: "GPU-hours" } },
        }), d.days.length === 0),
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

  /* Tables are <table data-endpoint="..." data-table="kind">: their <tbody> is rebuilt from the JSON. */
  function cellsOf(a, withAbs) {
    if (!a) { return withAbs ? [MISSING, MISSING, MISSING, MISSING, MISSING] : [MISSING, MISSING, MISSING, MISSING]; }
    var cells = [String(a.count), formatIterTime(a.predicted_iter_s), formatIterTime(a.measured_iter_s), pctText(a.error_pct, true)];
    return withAbs ? cells.concat([pctText(a.abs_error_pct, false)]) : cells;
  }

  var TABLES = {
    "prediction-accuracy": function (el, d) {
      var body = el.tBodies[0];
      body.innerHTML = "";
      if (!d.rows.length) {
        var empty = document.createElement("tr");
        var td = document.createElement("td");
        td.colSpan = 11; td.className = "empty";
        td.textContent = "No lease reported its speed in this window, and no workload has a GENIE fit.";
        empty.appendChild(td);
        body.appendChild(empty);
      }
      d.rows.forEach(function (r) {
        var tr = document.createElement("tr");
        [r.workload, r.shape].concat(cellsOf(r.live, true), cellsOf(r.profiled, false)).forEach(function (c) {
          var cell = document.createElement("td"); cell.textContent = c; tr.appendChild(cell);
        });
        body.appendChild(tr);
      });
      var note = document.getElementById("prediction-note");
      if (note) {
        note.textContent = d.capped ? "Live figures from the newest " + d.max_observations + " leases of the window only." : "";
      }
    },
  };

  /* 14:02:31: the browser's local time, 24-hour, as every page prints its times. */
  function clockTime(d) {
    function two(n) { return (n < 10 ? "0" : "") + n; }
    return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
  }

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

  function chosenWindow() {
    var select = document.getElementById("dash-window");
    return select ? select.value : "24h";
  }

  /* The page's URL and the dashboard links keep the window, so a reload or a shared link shows it. */
  function keepWindow(span) {
    var here = new URL(window.location.href);
    here.searchParams.set("window", span);
    window.history.replaceState(window.history.state, "", here.pathname + here.search + here.hash);
    document.querySelectorAll("a[data-keeps-window]").forEach(function (a) {
      var target = new URL(a.href, window.location.href);
      target.searchParams.set("window", span);
      a.href = target.pathname + target.search;
    });
  }

  function refreshCharts() {
    var charts = Array.prototype.slice.call(document.querySelectorAll(".chart[data-endpoint], table[data-endpoint][data-table]"));
    if (!charts.length) { return; }
    var span = chosenWindow();
    var byEndpoint = {};
    charts.forEach(function (el) { (byEndpoint[el.dataset.endpoint] = byEndpoint[el.dataset.endpoint] || []).push(el); });
    var jobs = Object.keys(byEndpoint).map(function (endpoint) {
      return fetchJson(endpoint + "?window=" + encodeURIComponent(span)).then(function (data) {
        byEndpoint[endpoint].forEach(function (el) {
          if (el.dataset.table) { TABLES[el.dataset.table](el, data); return; }
          var figure = RENDERERS[el.dataset.chart](data);
          Plotly.react(el, figure.traces, figure.layout, CONFIG);
        });
      });
    });
    Promise.all(jobs).then(function () {
      setStatus("updated " + clockTime(new Date()));
    }).catch(function (err) {
      setStatus("could not update: " + err.message, true);
    });
  }

  /* ---- what-if run page ---- */

  var METRICS = [["avg_jct_h", "Average JCT"], ["p99_jct_h", "p99 JCT"], ["makespan_h", "Makespan"]];

  function drawWhatIf(run) {
    var labels = run.runs.map(function (r) { return r.policy + "/" + r.allocator; });
    METRICS.forEach(function (m) {
      var el = document.querySelector('.whatif-chart[data-metric="' + m[0] + '"]');
      if (!el) { return; }
      var simulated = run.runs.map(function (r) { return r[m[0]]; });
      var recorded = run.actual && run.actual[m[0]] !== undefined && run.actual[m[0]] !== null ? [run.actual[m[0]]] : null;
      var axis = hoursAxis(recorded ? [simulated, recorded] : [simulated]);
      var traces = [{ x: labels, y: axis.scale(simulated), type: "bar", name: "simulated",
        text: simulated.map(function (h) { return h === null ? "" : hoursText(h); }), textposition: "auto",
        hovertemplate: "%{text}<extra>%{x}</extra>" }];
      if (recorded) {
        traces.push({ x: ["recorded (what happened)"], y: axis.scale(recorded), type: "bar", name: "recorded",
          text: recorded.map(hoursText), textposition: "auto", hovertemplate: "%{text}<extra>recorded</extra>" });
      }
      Plotly.react(el, traces, layout(m[1], { xaxis: { type: "category" }, yaxis: { title: { text: axis.name } },
        showlegend: !!run.actual }), CONFIG);
    });
    var note = document.getElementById("whatif-no-qos");
    if (note) {  // no QoS target in the trace: say why deadline policies match fifo and QoS is a dash
      note.hidden = !(run.runs.length && run.runs.every(function (r) { return !r.qos_jobs; }));
    }
    var body = document.getElementById("whatif-table-body");
    if (body) {
      body.innerHTML = "";
      var rows = run.runs.map(function (r) { return [r.policy + "/" + r.allocator, r]; });
      if (run.actual) { rows.push(["recorded (what happened)", run.actual]); }
      rows.forEach(function (row) {
        var tr = document.createElement("tr");
        var cells = [row[0]].concat(["avg_jct_h", "median_jct_h", "p99_jct_h", "makespan_h"].map(function (k) {
          return hoursText(row[1][k]);
        })).concat([row[1].qos_pct === null || row[1].qos_pct === undefined ? MISSING : Number(row[1].qos_pct).toFixed(1)]);
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
    var select = document.getElementById("dash-window");
    if (select) {
      select.addEventListener("change", function () {
        keepWindow(select.value);
        refreshCharts();
      });
      // Without script the form reloads the page with ?window=; with it, the charts redraw in place.
      select.form.addEventListener("submit", function (event) { event.preventDefault(); });
    }
    window.setInterval(refreshCharts, 1000 * Number(root.dataset.refreshS || 30));
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
