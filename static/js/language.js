// A language model's figures on its run page (templates/experiments/_language.html): tokens/s,
// MFU and bits per byte in the summary, and the latest text the model wrote. The server sends
// them with their texts (the snapshot's and each step and epoch message's `language`,
// dashboard/experiments/metrics/language.py); this script only places them, as text (the
// model's bytes are never HTML).
(function () {
  "use strict";

  const root = document.getElementById("experiment-detail");
  if (!root) return;
  const $ = (id) => document.getElementById(id);
  const { setText } = window.Trainyard;

  function place(language) {
    if (!language || typeof language !== "object" || !language.texts) return;
    const texts = language.texts;
    setText($("stat-tps"), texts.tokens_per_second);
    setText($("stat-mfu-value"), texts.mfu);
    const note = $("stat-mfu-note");
    if (note) {
      setText(note, texts.mfu_note);
      note.title = texts.peak_source || "";
    }
    setText($("stat-bpb"), texts.bits_per_byte);
    // A step's message has no text (only an evaluation writes one): the last one stays.
    if (language.sample && typeof language.sample.text === "string") {
      const pre = $("lm-sample");
      if (pre) {
        pre.textContent = language.sample.text;
        pre.hidden = false;
      }
      setText($("lm-sample-when"), texts.sample_when);
    }
  }

  root.addEventListener("run:message", function (event) {
    const msg = event.detail;
    if (!msg || typeof msg !== "object") return;
    if (msg.type === "snapshot" || msg.type === "step" || msg.type === "epoch") place(msg.language);
  });
})();
