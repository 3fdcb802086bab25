// The run page's fact panels (templates/experiments/_run_facts.html): scaling, per-rank figures,
// memory per rank, shared tensors, model stages and checkpoints. experiment_detail.js owns the socket and hands
// every snapshot and event to this script as a "run:message" DOM event on #experiment-detail.
// Built with DOM nodes (textContent), never HTML strings: every value comes from a run's report.
(function () {
  "use strict";

  const root = document.getElementById("experiment-detail");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const { isNum, setText, csrfToken, el, strategy } = window.Trainyard;

  // ---- scaling's figures change with every step: formatted here as scaling.py does -----------

  const whole = (v) => Math.round(v).toLocaleString("en-US");
  const throughputText = (v) => (isNum(v) ? whole(v) + " img/s" : "—");

  function show(tableId, emptyId, any) {
    $(tableId).hidden = !any;
    $(emptyId).hidden = any;
  }

  // ---- scaling: the run's mean throughput against its baseline's, updated per step ---------

  const scaling = { stepSum: 0, stepCount: 0, epochSum: 0, epochCount: 0, info: null };

  function addThroughput(kind, ips) {
    if (!isNum(ips)) return;
    if (kind === "step") {
      scaling.stepSum += ips;
      scaling.stepCount += 1;
    } else {
      scaling.epochSum += ips;
      scaling.epochCount += 1;
    }
  }

  function renderScaling() {
    const info = scaling.info;
    if (!info) return;
    // Step events first; a run without any (a dry run) falls back to its epoch events.
    let throughput = null;
    if (scaling.stepCount) throughput = scaling.stepSum / scaling.stepCount;
    else if (scaling.epochCount) throughput = scaling.epochSum / scaling.epochCount;
    if (throughput === null) throughput = info.throughput;
    setText($("scaling-throughput"), throughputText(throughput));
    setText($("scaling-world-size"), info.world_size);
    setText($("scaling-global-batch"), info.global_batch);
    const base = info.baseline;
    let speedup = null;
    if (base && base.id === info.id) speedup = isNum(throughput) ? 1 : null;
    else if (base && isNum(base.throughput) && base.throughput > 0 && isNum(throughput)) {
      speedup = throughput / base.throughput;
    }
    setText($("scaling-speedup"), isNum(speedup) ? speedup.toFixed(2) + "×" : "—");
    const efficiency = isNum(speedup) ? speedup / Math.max(1, info.world_size) : null;
    setText($("scaling-efficiency"), isNum(efficiency) ? Math.round(efficiency * 100) + "%" : "—");
  }

  // ---- ranks ---------------------------------------------------------------------------------

  // Rows as dashboard/experiments/core/run_facts.py wrote them (a message's `texts.ranks`).
  function rankRow(rank) {
    const label = rank.split_text || "";
    const bar = el("div", { class: "split-bar", role: "img", "aria-label": label, title: label }, [
      el("span", { class: "data", style: "width: " + (rank.data_percent || 0) + "%" }),
      el("span", { class: "compute", style: "width: " + (rank.compute_percent || 0) + "%" }),
    ]);
    return el("tr", {}, [
      // On a run over several machines, the machine the rank ran on.
      el("td", {}, rank.machine
        ? [String(rank.rank), " ", el("span", { class: "muted small" }, rank.machine)]
        : String(rank.rank)),
      el("td", { class: "num" }, rank.ips_text ?? "—"),
      el("td", { class: "col-split" }, bar),
      el("td", { class: "num" }, rank.data_text ?? "—"),
      el("td", { class: "num" }, rank.compute_text ?? "—"),
      el("td", { class: "num" }, rank.rss_text ?? "—"),
    ]);
  }

  function renderRanks(rows, step) {
    rows = Array.isArray(rows) ? rows.filter((r) => r && typeof r === "object") : [];
    $("ranks-body").replaceChildren(...rows.map(rankRow));
    show("ranks-table", "ranks-empty", rows.length > 0);
    setText($("ranks-when"), isNum(step) && rows.length ? "at step " + step : "");
  }

  // ---- memory per rank: what each rank holds at an epoch's end ------------------------------

  // Rows as dashboard/experiments/core/memory.py wrote them (the epoch message's and the
  // snapshot's `texts.memory`).
  function memoryRow(m) {
    const share = m.share_title ?? "";
    const bar = el("div", { class: "split-bar", role: "img", "aria-label": share, title: share },
      isNum(m.share_percent) ? el("span", { class: "held", style: "width: " + m.share_percent + "%" }) : null);
    const bytes = (text, value) => el("td", { class: "num", title: String(value ?? "") + " bytes" }, text ?? "—");
    return el("tr", { "data-rank": String(m.rank) }, [
      el("td", {}, String(m.rank)),
      bytes(m.parameters_text, m.parameter_bytes),
      el("td", { class: "col-share" }, el("div", { class: "share" }, [bar, el("span", { class: "num" }, m.share_text ?? "—")])),
      bytes(m.gradients_text, m.gradient_bytes),
      bytes(m.optimizer_text, m.optimizer_state_bytes),
      bytes(m.held_text, m.held_bytes),
      bytes(m.peak_text, m.peak_bytes),
    ]);
  }

  function renderMemory(rows) {
    if (!Array.isArray(rows)) return;
    rows = rows.filter((r) => r && typeof r === "object");
    $("memory-body").replaceChildren(...rows.map(memoryRow));
    show("memory-table", "memory-empty", rows.length > 0);
  }

  // ---- shared tensors and stages ------------------------------------------------------------

  // `texts` of a started message or the snapshot: {shared_tensors: rows, shared_total_text}.
  function renderTensors(texts) {
    const rows = texts && Array.isArray(texts.shared_tensors) ? texts.shared_tensors : [];
    const tensors = rows.filter((t) => t && typeof t === "object");
    $("tensors-body").replaceChildren(...tensors.map((t) => el("tr", {}, [
      el("td", {}, t.name ?? ""),
      el("td", {}, t.dtype ?? ""),
      el("td", {}, t.shape_text ?? ""),
      el("td", { class: "num", title: String(t.bytes ?? "") + " bytes" }, t.bytes_text ?? "?"),
      el("td", {}, t.is_shared
        ? el("span", { class: "badge online" }, "shared")
        : el("span", { class: "badge warning" }, "not shared")),
    ])));
    show("tensors-table", "tensors-empty", tensors.length > 0);
    const total = $("tensors-total");
    total.hidden = tensors.length === 0;
    setText(total, (texts && texts.shared_total_text) || "");
  }

  function renderStages(stages) {
    stages = Array.isArray(stages) ? stages.filter((s) => s && typeof s === "object") : [];
    $("stages-list").replaceChildren(...stages.map((s) => el("li", {}, [
      el("span", { class: "stage-name" }, s.name ?? ""),
      " ",
      el("span", { class: "muted" }, "on"),
      " ",
      el("code", {}, s.device ?? ""),
    ])));
    $("stages-box").hidden = stages.length === 0;
  }

  // ---- checkpoints --------------------------------------------------------------------------

  function checkpointRow(c) {
    let file;
    if (c.here === false) {
      file = el("span", { class: "muted", title: c.where || "" },
        "on " + (c.worker || "the worker") + ", not on this web server");
    } else {
      // A live event cannot know whether this web server sees the file; the link says so if not.
      file = el("a", { href: c.url, download: "" }, "Download");
    }
    return el("tr", { "data-step": String(c.step) }, [
      el("td", {}, String(c.epoch)),
      el("td", { class: "num" }, isNum(c.step) ? String(c.step) : "—"),
      el("td", {}, c.kind_text ?? ""),
      el("td", { class: "num" }, c.size_text ?? "?"),
      el("td", {}, file),
    ]);
  }

  function renderCheckpoints(list) {
    list = Array.isArray(list) ? list : [];
    $("checkpoints-body").replaceChildren(...list.map(checkpointRow));
    show("checkpoints-table", "checkpoints-empty", list.length > 0);
  }

  function addCheckpoint(msg) {
    if (!isNum(msg.step) || typeof msg.url !== "string" || !msg.url.startsWith("/")) return;
    const body = $("checkpoints-body");
    const row = checkpointRow(Object.assign({}, msg, msg.texts));
    const old = body.querySelector('tr[data-step="' + msg.step + '"]');
    if (old) old.replaceWith(row);
    else {
      // In step order: a resumed attempt writes steps again that the list already has.
      const after = [...body.children].find((tr) => Number(tr.dataset.step) > msg.step);
      body.insertBefore(row, after || null);
    }
    // Older files the training's retention deleted (the sink says which, by step).
    for (const step of Array.isArray(msg.pruned) ? msg.pruned : []) {
      if (!Number.isInteger(step)) continue;
      const gone = body.querySelector('tr[data-step="' + step + '"]');
      if (gone) gone.remove();
    }
    show("checkpoints-table", "checkpoints-empty", body.children.length > 0);
  }

  // ---- checkpoint now: POST, then wait for the training's checkpoint event ----------------

  const checkpointButton = $("checkpoint-button");
  const checkpointStatus = $("checkpoint-status");
  const checkpoint = {
    pending: Boolean(checkpointButton && checkpointButton.textContent.includes("requested")),
    status: null, // the run's, once a snapshot or event has said it
  };

  function say(text, isError) {
    checkpointStatus.textContent = text;
    checkpointStatus.classList.toggle("error-text", Boolean(isError));
    checkpointStatus.hidden = !text;
  }

  function renderCheckpointButton() {
    if (!checkpointButton) return;
    const running = checkpoint.status === "running";
    checkpointButton.hidden = checkpoint.status !== null && !running && checkpoint.status !== "queued";
    checkpointButton.disabled = checkpoint.pending || !running;
    checkpointButton.textContent = checkpoint.pending ? "Checkpoint requested…" : "Checkpoint now";
  }

  async function checkpointRequest() {
    checkpoint.pending = true;
    renderCheckpointButton();
    say("Requested: rank 0 writes it after its current step.");
    try {
      const response = await fetch(checkpointButton.dataset.url, {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRFToken": csrfToken(), Accept: "application/json" },
      });
      let body = {};
      try { body = await response.json(); } catch (err) { body = {}; }
      if (!response.ok) throw new Error(body.error || "the server answered " + response.status);
    } catch (err) {
      checkpoint.pending = false;
      renderCheckpointButton();
      say("Could not ask for a checkpoint: " + err.message + ".", true);
    }
  }

  function onRunStatus(status) {
    if (typeof status !== "string") return;
    checkpoint.status = status;
    if (status !== "running" && status !== "queued") {
      // Rendered while the run was live: "no tensors … yet" is final now.
      setText($("tensors-empty"), "The run has reported no tensors in shared memory.");
    }
    if (status !== "running" && status !== "queued" && checkpoint.pending) {
      // The run ended first; its last epoch's checkpoint, if any, is in the list.
      checkpoint.pending = false;
      say("");
    }
    renderCheckpointButton();
  }

  function onCheckpointWritten(msg) {
    // Only the checkpoint that took the request answers it (an epoch's may, at its end).
    if (!checkpoint.pending || msg.answers_request !== true) return;
    checkpoint.pending = false;
    renderCheckpointButton();
    say(msg.requested === true
      ? "Saved at step " + msg.step + " (epoch " + msg.epoch + ")."
      : "Saved with epoch " + msg.epoch + "'s checkpoint (step " + msg.step + ").");
  }

  if (checkpointButton) checkpointButton.addEventListener("click", checkpointRequest);

  // ---- messages ------------------------------------------------------------------------------

  function onSnapshot(msg) {
    if (msg.scaling) scaling.info = msg.scaling;
    scaling.stepSum = scaling.stepCount = scaling.epochSum = scaling.epochCount = 0;
    // The images/s series holds the step events' figures: its buckets' means weighted by count.
    const ips = (msg.series || {}).images_per_second;
    for (const b of ips ? ips.buckets : []) {
      // [step_first, step_last, time_first, time_last, min, max, mean, last, n]
      if (isNum(b[6]) && b[8] > 0) {
        scaling.stepSum += b[6] * b[8];
        scaling.stepCount += b[8];
      }
    }
    renderScaling();
    const texts = msg.texts || {};
    renderTensors(texts);
    renderStages((msg.run || {}).stages);
    renderRanks(texts.ranks, (msg.rank_stats || {}).step);
    renderMemory(texts.memory || []);
    renderCheckpoints(texts.checkpoints);
    if (msg.experiment) {
      // The row keeps a request until the training's checkpoint answers it.
      const was = checkpoint.pending;
      checkpoint.pending = msg.experiment.checkpoint_requested === true;
      if (was && !checkpoint.pending) say("");
      onRunStatus(msg.experiment.status);
    }
  }

  function onStarted(msg) {
    renderTensors(msg.texts);
    renderStages(msg.stages);
    if (scaling.info) {
      // Only process strategies count processes; the others count devices (scaling.py).
      if (isNum(msg.world_size) && strategy(scaling.info.strategy).processes) {
        scaling.info.world_size = msg.world_size;
      }
      if (isNum(msg.global_batch_size)) scaling.info.global_batch = msg.global_batch_size;
    }
    renderScaling();
  }

  function onProgress(msg) {
    addThroughput(msg.type, msg.images_per_second);
    renderScaling();
    if (msg.texts && msg.texts.ranks) renderRanks(msg.texts.ranks, msg.step);
    // An engine's epoch events, a script's step events (its observer's windows, protocol 1.12);
    // an engine's steps leave the last epoch's figures in place.
    if (msg.texts && msg.texts.memory) renderMemory(msg.texts.memory);
  }

  function onCheckpoint(msg) {
    addCheckpoint(msg);
    onCheckpointWritten(msg);
  }

  // The run's status changed, or it ended.
  const onStatus = (msg) => onRunStatus(msg.status);

  // One handler per message type (dashboard/experiments/core/messages.py says what each carries);
  // no prototype, so that a type named like an Object method finds no handler.
  const HANDLERS = Object.assign(Object.create(null), {
    snapshot: onSnapshot,
    started: onStarted,
    step: onProgress,
    epoch: onProgress,
    checkpoint: onCheckpoint,
    status: onStatus,
    finished: onStatus,
    failed: onStatus,
  });
  // Unknown types are ignored, as the protocol asks.
  const ignore = () => {};

  root.addEventListener("run:message", function (event) {
    const msg = event.detail;
    if (!msg || typeof msg !== "object") return;
    (HANDLERS[msg.type] || ignore)(msg);
  });
})();
