// The foldable sections of the run, compare and study pages (<details class="page-section">,
// dashboard/experiments/templatetags/page_sections.py; titles and which are open at first come
// from the series contract's SECTIONS). A user's folding is remembered per user in this
// browser's localStorage, under a key holding their id, by section id across the three pages
// (fold "System" once, it stays folded on every run): a view preference of a screen, kept
// without a request per click or a table of its own; two people sharing a browser keep theirs.
(function () {
  "use strict";

  const user = document.currentScript && document.currentScript.dataset.user;
  const KEY = "trainyard:sections:" + (user || "anonymous");

  function read() {
    try {
      return JSON.parse(window.localStorage.getItem(KEY) || "{}") || {};
    } catch (err) {
      return {}; // storage refused (private mode) or garbled: the defaults
    }
  }

  function write(chosen) {
    try {
      window.localStorage.setItem(KEY, JSON.stringify(chosen));
    } catch (err) {
      // storage refused: the section still folds, for this page only
    }
  }

  function start() {
    const chosen = read();
    for (const section of document.querySelectorAll("details.page-section[data-section]")) {
      const id = section.dataset.section;
      if (typeof chosen[id] === "boolean") section.open = chosen[id];
      section.addEventListener("toggle", () => {
        const now = read();
        now[id] = section.open;
        write(now);
      });
    }
    document.documentElement.setAttribute("data-sections-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
