// The live experiment page: draws the stored curve at once (embedded snapshot), then follows
// /ws/experiments/<id>/ — a snapshot on every connect, then events numbered by `seq`.
(function () {
  "use strict";

  const root = document.getElementById("experiment-detail");
  if (!root) return;

  const {
    isNum, setText, formatDuration, formatPercent, csrfToken, statusLabel, facts, logLine,
    runSocket,
  } = window.Trainyard;
  // From the model's statuses (sent in the page): a lost run is neither, it may be queued again.
  const FINAL = new Set(facts.final_statuses);
  const ACTIVE = new Set(facts.active_statuses);
  const MAX_LOG_LINES = 500;

  const $ = (id) => document.getElementById(id);
  const wsPath = root.dataset.wsPath;
  const stopUrl = root.dataset.stopUrl;
  const experimentUrl = root.dataset.apiUrl;

  // ---- state -------------------------------------------------------------------------------

  const state = {
    experiment: {},
    ips: null,
  };

  // ---- formatting --------------------------------------------------------------------------

  // A diverging run reaches losses like 1.6e11: fixed notation would overflow its box.
  const formatLoss = (v) =>
    !isNum(v) ? "—" : Math.abs(v) >= 1e5 ? v.toExponential(3) : v.toFixed(4);

  const dateFormat = new Intl.DateTimeFormat(undefined, {
    year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit",
  });

  function setTime(el, iso) {
    if (!el) return;
    if (!iso) {
      el.removeAttribute("datetime");
      setText(el, "—");
      return;
    }
    const date = new Date(iso);
    if (isNaN(date)) return;
    el.setAttribute("datetime", iso);
    setText(el, dateFormat.format(date));
    el.title = date.toString();
  }

  // ---- charts (static/js/charts.js draws them) -----------------------------------------------

  const Charts = window.TrainyardCharts;
  const metricsUrl = root.dataset.metricsUrl;
  // What turns steps and times into the other x axes; every line of the page shares it.
  const runCtx = { globalBatch: null, startedAt: null };
  let chartSet = null;

  // A drag-zoom asks the metrics API for finer buckets of the line's step range.
  async function fetchRange(line, from, to) {
    const key = line.meta.key;
    const url = metricsUrl + "?keys=" + encodeURIComponent(key) + "&from=" + from + "&to=" + to;
    try {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) return null;
      return ((await response.json()).series || {})[key] || null;
    } catch (err) {
      return null; // the coarser buckets stay drawn
    }
  }

  function initCharts() {
    const box = $("charts");
    if (!box || !window.TrainyardCharts) return;
    chartSet = new Charts.ChartSet(box, { fetchRange });
    Charts.xSelectBind($("chart-x"), chartSet);
  }

  function runContext(run, experiment) {
    if (run && isNum(run.global_batch_size)) runCtx.globalBatch = run.global_batch_size;
    if (experiment && experiment.started_at) runCtx.startedAt = Date.parse(experiment.started_at) / 1000;
  }

  // The chart and line of a series key, made on first sight (machine and GPU series); none for
  // the figures this page shows another way (the contract's run_page: false, the phases' view).
  function lineOf(key) {
    const found = chartSet && Charts.specOf(key);
    if (!found || found.spec.run_page === false) return null;
    return { chart: found.spec, name: found.line, opts: { color: Charts.specColor(found.spec), ctx: runCtx, meta: { key } } };
  }

  function resetSeries(all) {
    if (!chartSet) return;
    for (const [key, series] of Object.entries(all || {})) {
      const at = lineOf(key);
      if (at) chartSet.chart(at.chart).setLine(at.name, Object.assign({ series }, at.opts));
    }
    chartSet.redrawAll();
  }

  function appendSeries(points) {
    for (const [key, list] of Object.entries(points || {})) {
      const at = lineOf(key);
      if (at && Array.isArray(list)) chartSet.chart(at.chart).append(at.name, list, at.opts);
    }
  }

  // Benchmarks and browser tests wait on this: every chart has drawn the snapshot.
  function markChartsReady() {
    requestAnimationFrame(() => document.querySelector("main").setAttribute("data-charts-ready", "true"));
  }

  // ---- log -----------------------------------------------------------------------------------

  const logBox = $("log-box");

  function atBottom() {
    return logBox.scrollHeight - logBox.scrollTop - logBox.clientHeight < 24;
  }

  function resetLogs(lines) {
    const fragment = document.createDocumentFragment();
    for (const line of (lines || []).slice(-MAX_LOG_LINES)) fragment.append(logLine(line));
    if (!lines || !lines.length) {
      const li = document.createElement("li");
      li.className = "log-empty muted";
      li.textContent = "Nothing logged yet.";
      fragment.append(li);
    }
    logBox.replaceChildren(fragment);
    logBox.scrollTop = logBox.scrollHeight;
  }

  function appendLog(line) {
    const stick = atBottom();
    const empty = logBox.querySelector(".log-empty");
    if (empty) empty.remove();
    logBox.append(logLine(line));
    while (logBox.children.length > MAX_LOG_LINES) logBox.firstElementChild.remove();
    if (stick) logBox.scrollTop = logBox.scrollHeight;
  }

  // ---- page state ----------------------------------------------------------------------------

  // The header's Stop and the same one in the stalled banner (templates/experiments/_stalled.html).
  const stopButtons = Array.from(document.querySelectorAll("#stop-button, [data-run-stop]"));
  const stopError = $("stop-error");
  let stopping = stopButtons.some((button) => button.disabled);

  function renderStatus(status) {
    const badge = $("status-badge");
    setText(badge, statusLabel(status));
    badge.className = "badge status-" + status;
    const fill = $("progress-bar").firstElementChild;
    fill.className = "status-" + status;
    if (!ACTIVE.has(status)) for (const button of stopButtons) button.hidden = true;
  }

  function renderProgress() {
    const e = state.experiment;
    let pct = 0;
    if (e.status === "succeeded") pct = 100;
    else if (isNum(e.total_steps) && e.total_steps > 0) pct = Math.min(100, (100 * e.step) / e.total_steps);
    const bar = $("progress-bar");
    bar.setAttribute("aria-valuenow", pct.toFixed(1));
    bar.firstElementChild.style.width = pct + "%";
    setText($("progress-pct"), Math.round(pct) + "%");
    setText($("stat-epoch"), (e.epoch || 0) + " / " + (e.epochs || "—"));
    setText($("stat-step"), (e.step || 0) + " / " + (isNum(e.total_steps) ? e.total_steps : "—"));
    setText($("stat-accuracy"), formatPercent(e.test_accuracy));
    setText($("stat-loss"), formatLoss(e.test_loss));
    setText($("stat-ips"), isNum(state.ips) ? Math.round(state.ips).toLocaleString() + " img/s" : "—");
  }

  function renderNotes(notes) {
    const box = $("notes-box");
    const list = $("notes-list");
    notes = Array.isArray(notes) ? notes : [];
    box.hidden = notes.length === 0;
    const current = Array.from(list.children, (li) => li.textContent);
    if (current.join("\n") === notes.join("\n")) return;
    list.replaceChildren(...notes.map((note) => {
      const li = document.createElement("li");
      li.textContent = note;
      return li;
    }));
  }

  function renderError(status, error) {
    const box = $("error-box");
    const show = Boolean(error) && status !== "succeeded";
    box.hidden = !show;
    if (show) {
      // A Stop is the user's own doing: told plainly, not in a failure's red.
      box.classList.toggle("error", status !== "cancelled");
      box.classList.toggle("warning", status === "cancelled");
      setText($("error-title"), status === "cancelled" ? "Stopped" : "The run failed");
      setText($("error-text"), error);
    }
  }

  function renderDuration() {
    const e = state.experiment;
    let seconds = null;
    if (e.started_at) {
      const end = e.finished_at ? new Date(e.finished_at) : new Date();
      seconds = (end - new Date(e.started_at)) / 1000;
    } else if (isNum(e.duration)) {
      seconds = e.duration;
    }
    setText($("stat-duration"), formatDuration(seconds));
  }

  function renderWaiting(status, reason) {
    const box = $("waiting-box");
    if (!box) return;
    box.hidden = !(status === "queued" && reason);
    setText($("waiting-text"), reason || "");
  }

  function applyExperiment(e) {
    if (!e || typeof e !== "object") return;
    Object.assign(state.experiment, e);
    const x = state.experiment;
    renderStatus(x.status);
    renderProgress();
    renderNotes(x.notes);
    renderError(x.status, x.error);
    renderWaiting(x.status, x.waiting_reason);
    if ("worker" in e) setText($("info-worker"), x.worker || "—");
    if ("dataset_source" in e) setText($("info-dataset-source"), x.dataset_source || "—");
    if ("started_at" in e) setTime($("info-started"), x.started_at);
    if ("finished_at" in e) setTime($("info-finished"), x.finished_at);
    if (x.stop_requested && stopButtons.length && !stopping) markStopping();
    renderDuration();
    if (e.started_at && !isNum(runCtx.startedAt)) {
      runContext(null, e);
      if (chartSet && chartSet.xMode === "wall") chartSet.redrawAll();
    }
  }

  // ---- events --------------------------------------------------------------------------------

  // The run's other panels (static/js/run_facts.js) follow the same messages.
  function announce(msg) {
    root.dispatchEvent(new CustomEvent("run:message", { detail: msg }));
  }

  function handleSnapshot(msg) {
    announce(msg);
    const series = msg.series || {};
    // The run's images/s over the training so far (dashboard/experiments/metrics/throughput.py),
    // as each step message brings it: the same figure live and after a reload.
    state.ips = isNum(msg.throughput) ? msg.throughput : null;
    runContext(msg.run, msg.experiment);
    applyExperiment(msg.experiment);
    if (msg.texts) onScheduler({ text: msg.texts.scheduler });
    resetSeries(series);
    resetLogs(msg.logs);
    markChartsReady();
  }

  // One handler per message type (dashboard/experiments/core/messages.py says what each carries).

  function onStarted(msg) {
    const e = state.experiment;
    applyExperiment({
      status: ACTIVE.has(e.status) ? "running" : e.status,
      total_steps: msg.total_steps,
      epochs: isNum(msg.epochs) ? msg.epochs : e.epochs,
      notes: msg.notes || [],
      dataset_source: msg.dataset_source,
    });
    if (Array.isArray(msg.devices) && msg.devices.length) setText($("info-device"), msg.devices.join(", "));
    else if (msg.device) setText($("info-device"), msg.device);
    if (isNum(msg.world_size)) setText($("info-world-size"), msg.world_size);
    // Which ranks ran where: torchrun's rendezvous decides it, so it is known only now.
    if (msg.texts && msg.texts.machines_text && $("info-machines")) setText($("info-machines"), msg.texts.machines_text);
    if (isNum(msg.global_batch_size) && msg.global_batch_size !== runCtx.globalBatch) {
      runContext(msg, null);
      if (chartSet && chartSet.xMode === "images") chartSet.redrawAll();
    }
    for (const note of msg.notes || []) appendLog({ time: msg.time, level: "info", message: note });
  }

  function onStep(msg) {
    appendSeries(Charts.messagePoints(msg));
    // The run's figure so far; the message's images_per_second is its window's (the chart's).
    if (isNum(msg.throughput)) state.ips = msg.throughput;
    Object.assign(state.experiment, { epoch: msg.epoch, step: msg.step });
    renderProgress();
  }

  function onEpoch(msg) {
    appendSeries(Charts.messagePoints(msg));
    if (isNum(msg.throughput)) state.ips = msg.throughput;
    Object.assign(state.experiment, {
      epoch: msg.epoch, step: msg.step, test_loss: msg.test_loss, test_accuracy: msg.test_accuracy,
    });
    renderProgress();
  }

  // Series the step and epoch events do not carry (machine and GPU samples).
  const onSeries = (msg) => appendSeries(Charts.messagePoints(msg));

  function onCheckpoint(msg) {
    // The stored log line's words, which the sink sends along.
    appendLog({ time: msg.time, level: "info", message: msg.log_text });
  }

  // A stall's line, as the sink stored it with the row's change (none where nothing changed);
  // the banner is static/js/stalled.js's.
  function onStalled(msg) {
    if (msg.text) appendLog({ time: msg.time, level: msg.level, message: msg.text });
  }

  // A Slurm run's job changed (submitted, started, its state or reason in the cluster's queue):
  // the server's line for it (core/messages.py's scheduler message), as the snapshot's.
  function onScheduler(msg) {
    if ($("info-scheduler") && typeof msg.text === "string") setText($("info-scheduler"), msg.text);
  }

  function onStatus(msg) {
    applyExperiment(
      Object.assign(
        {},
        msg.status ? { status: msg.status } : {},
        "reason" in msg ? { waiting_reason: msg.reason } : {},
        msg.worker ? { worker: msg.worker } : {},
        msg.started_at ? { started_at: msg.started_at } : {},
      ),
    );
  }

  function onFinished(msg) {
    applyExperiment({
      status: msg.status || "succeeded",
      test_loss: msg.test_loss,
      test_accuracy: msg.test_accuracy,
      finished_at: state.experiment.finished_at || new Date().toISOString(),
    });
  }

  function onFailed(msg) {
    const e = state.experiment;
    if (msg.traceback) appendLog({ time: msg.time, level: "error", message: msg.traceback });
    applyExperiment({
      status: msg.status || "failed",
      error: msg.error || e.error,
      finished_at: e.finished_at || new Date().toISOString(),
    });
  }

  // No prototype: a type named like an Object method finds no handler.
  const HANDLERS = Object.assign(Object.create(null), {
    started: onStarted,
    step: onStep,
    epoch: onEpoch,
    log: appendLog,
    checkpoint: onCheckpoint,
    status: onStatus,
    finished: onFinished,
    failed: onFailed,
    series: onSeries,
    stalled: onStalled,
    scheduler: onScheduler,
  });
  // Unknown types are ignored, as the protocol asks.
  const ignore = () => {};

  function handleEvent(msg) {
    announce(msg);
    (HANDLERS[msg.type] || ignore)(msg);
  }

  // ---- connection ----------------------------------------------------------------------------

  const conn = $("conn");
  let socket = null;

  function setConn(kind, text, title) {
    conn.dataset.state = kind;
    conn.title = title || "";
    setText($("conn-text"), text);
  }

  const isFinal = () => FINAL.has(state.experiment.status);

  function closeForGood() {
    if (socket) socket.close();
  }

  // ---- stop ----------------------------------------------------------------------------------

  function markStopping() {
    stopping = true;
    for (const button of stopButtons) {
      button.disabled = true;
      button.textContent = "Stopping…";
    }
  }

  // After a refused stop the page may be behind (the run ended meanwhile): ask for the truth.
  async function refreshExperiment() {
    if (!experimentUrl) return;
    try {
      const response = await fetch(experimentUrl, {
        credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store",
      });
      if (!response.ok) return;
      applyExperiment(await response.json());
      if (isFinal()) closeForGood();
    } catch (err) {
      // The socket will catch up.
    }
  }

  // Stop asks first where the run was launched long ago (the server's words on #stop-button).
  const stopAsk = document.getElementById("stop-button");
  for (const button of stopButtons) {
    button.addEventListener("click", async function () {
      if (stopping) return;
      if (stopAsk && !Trainyard.endConfirmed({
        text: stopAsk.dataset.confirmText, from: stopAsk.dataset.confirmFrom,
      })) return;
      markStopping();
      stopError.hidden = true;
      try {
        const response = await fetch(stopUrl, {
          method: "POST",
          credentials: "same-origin",
          headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
        });
        let body = {};
        try {
          body = await response.json();
        } catch (err) {
          body = {};
        }
        if (!response.ok) {
          throw new Error(body.error || "The server answered " + response.status + ".");
        }
        // The answer is the experiment as it now stands (a queued run is cancelled at once).
        if (body && body.status) applyExperiment(body);
        if (isFinal()) closeForGood();
      } catch (err) {
        stopping = false;
        for (const other of stopButtons) {
          other.disabled = false;
          other.textContent = "Stop";
        }
        stopError.textContent = "Could not stop the run: " + err.message;
        stopError.hidden = false;
        refreshExperiment();
      }
    });
  }

  // ---- start ---------------------------------------------------------------------------------

  initCharts();
  const initialEl = $("experiment-snapshot");
  if (initialEl) handleSnapshot(JSON.parse(initialEl.textContent));
  for (const el of document.querySelectorAll("time[datetime]")) setTime(el, el.getAttribute("datetime"));
  setInterval(function () {
    if (!isFinal() && state.experiment.started_at) renderDuration();
  }, 1000);
  // A finished run still connects once: its snapshot is the record the page should show.
  socket = runSocket(wsPath, {
    isFinal,
    onState: setConn,
    checkUrl: experimentUrl,
    onSnapshot: handleSnapshot,
    onEvent(msg) {
      handleEvent(msg);
      // A resumed attempt replaces the points after its checkpoint: redraw from the record.
      if (msg.type === "status" && msg.resumed) socket.resync("resumed");
    },
  });
})();
