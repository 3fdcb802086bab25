// The run page's tags and note (owner or staff): saved with PATCH /api/experiments/<id>/; the
// server cleans the tags (trimmed, no repeats) and the form shows what it kept.
(function () {
  "use strict";

  const form = document.getElementById("labels-form");
  if (!form) return;

  const { setText, csrfToken } = window.Trainyard;
  const tagsInput = document.getElementById("labels-tags");
  const noteInput = document.getElementById("labels-note");
  const status = document.getElementById("labels-status");

  form.addEventListener("submit", async function (event) {
    event.preventDefault();
    const tags = tagsInput.value.split(",").map((tag) => tag.trim()).filter(Boolean);
    setText(status, "Saving…");
    try {
      const response = await fetch(form.dataset.apiUrl, {
        method: "PATCH",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", "X-CSRFToken": csrfToken() },
        body: JSON.stringify({ tags, note: noteInput.value }),
      });
      const body = await response.json().catch(() => ({}));
      if (!response.ok) {
        const why = Object.values(body.errors || {}).flat().join("; ");
        setText(status, "Not saved: " + (why || body.error || "HTTP " + response.status));
        return;
      }
      tagsInput.value = (body.tags || []).join(", ");
      noteInput.value = body.note || "";
      setText(status, "Saved.");
    } catch (err) {
      setText(status, "Not saved: " + err.message);
    }
  });
})();
