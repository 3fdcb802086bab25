// The queue page: draw GET /api/queue/ (dashboard/experiments/web/api_queue.py) and poll it.
// Built with DOM nodes (textContent), never HTML strings: names come from users.
(function () {
  "use strict";

  const root = document.getElementById("queue");
  if (!root) return;
  const apiUrl = root.dataset.apiUrl;
  const pollMs = (Number(root.dataset.pollSeconds) || 3) * 1000;
  const { el, setText, csrfToken, statusLabel, strategy } = window.Trainyard;
  const rows = document.getElementById("queue-rows");
  const errorBox = document.getElementById("queue-error");

  function showError(message) {
    setText(errorBox, message || "");
    errorBox.hidden = !message;
  }

  async function post(url, body) {
    const response = await fetch(url, {
      method: "POST",
      credentials: "same-origin",
      headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) {
      const answer = await response.json().catch(() => ({}));
      throw new Error(answer.error || `${response.status} ${response.statusText}`);
    }
    return response.json();
  }

  // A change, then the queue again: positions move for every run, not only this one.
  async function act(action) {
    try {
      await action();
      showError("");
    } catch (err) {
      showError(err.message);
    }
    refresh();
  }

  function priorityCell(entry, listing) {
    if (!listing.can_set_priority) return el("td", { class: "num" }, String(entry.priority));
    const [low, high] = listing.priority_range;
    const input = el("input", {
      type: "number", min: String(low), max: String(high), step: "1", value: String(entry.priority),
      class: "priority-input", "aria-label": `Priority of #${entry.id}`,
    });
    const button = el("button", { type: "button", class: "button small priority-set" }, "Set");
    button.addEventListener("click", () =>
      act(() => post(entry.priority_url, { priority: Number(input.value) })),
    );
    return el("td", { class: "num" }, el("span", { class: "queue-priority" }, [input, button]));
  }

  function cancelCell(entry) {
    const button = el("button", { type: "button", class: "button small danger queue-cancel" }, "Cancel");
    button.addEventListener("click", () => {
      if (!Trainyard.endConfirmed(entry.cancel_confirm)) return;
      button.disabled = true;
      act(() => post(entry.stop_url));
    });
    return el("td", {}, button);
  }

  function row(entry, listing) {
    const run = el("td", { class: "col-name" }, [
      el("a", { href: entry.url }, `#${entry.id} ${entry.name}`), " ",
      el("span", { class: `badge status-${entry.status}` }, statusLabel(entry.status)),
    ]);
    const devices = `${strategy(entry.strategy).short} · ${entry.devices_label}` +
      (entry.nodes > 1 ? ` × ${entry.nodes} machines` : "");
    return el("tr", { "data-id": String(entry.id) }, [
      el("td", { class: "num", "data-field": "position" }, [
        String(entry.position), el("div", { class: "muted small" }, entry.ahead_text),
      ]),
      run,
      el("td", {}, entry.owner),
      el("td", {}, devices),
      priorityCell(entry, listing),
      el("td", { "data-field": "reason" }, entry.reason),
      el("td", { "data-field": "estimate", title: entry.estimated_start || "" }, [
        entry.estimated_start_text,
        el("div", { class: "muted small", "data-field": "estimate-basis" }, entry.estimated_start_basis),
      ]),
      cancelCell(entry),
    ]);
  }

  // Keep a row whose priority field has the focus, so typing is not undone by a poll.
  function editing() {
    return document.activeElement && document.activeElement.classList.contains("priority-input");
  }

  function draw(listing) {
    if (editing()) return;
    rows.replaceChildren(...listing.queue.map((entry) => row(entry, listing)));
    document.getElementById("queue-table").hidden = !listing.queue.length;
    document.getElementById("queue-empty").hidden = listing.queue.length > 0;
    setText(document.getElementById("queue-summary"), listing.summary);
    setText(document.getElementById("queue-estimate"), listing.estimate);
    setText(document.getElementById("queue-order"), listing.order);
  }

  async function refresh() {
    try {
      const response = await fetch(apiUrl, { credentials: "same-origin" });
      if (!response.ok) throw new Error(`the queue could not be read (${response.status})`);
      draw(await response.json());
    } catch (err) {
      showError(err.message);
    }
  }

  draw(JSON.parse(document.getElementById("queue-initial").textContent));
  setInterval(refresh, pollMs);
})();
