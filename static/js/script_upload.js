// The launch form's code upload for a user's own script: a chosen folder is packed here as a
// .tar.gz (ustar, gzip by the browser's CompressionStream), or a chosen archive sent as it is,
// to POST /api/code/; the answered id goes in the hidden `code` field, so a refused launch does
// not upload again. The server checks every bound again and says what is wrong; this script
// checks the count and size first only so that a huge folder is not read into memory.
(function () {
  "use strict";

  const set = document.getElementById("script-fields");
  if (!set || !window.Trainyard || typeof CompressionStream === "undefined") return;
  const code = document.getElementById("id_code");
  const codePath = document.getElementById("id_code_path");
  const status = document.getElementById("code-status");
  const entrypoints = document.getElementById("script-entrypoints");
  const folderInput = document.getElementById("code-folder");
  const archiveInput = document.getElementById("code-archive");
  const submit = document.querySelector('#experiment-form button[type="submit"]');
  const bound = (name) => Number(set.getAttribute("data-" + name));
  // Never part of the code: version control, virtual environments, caches (as `trainyard run`
  // leaves them out, with the folder's .gitignore besides; the page does not read .gitignore).
  const SKIPPED = new Set([
    ".git", ".hg", ".svn", "__pycache__", ".venv", "venv", "node_modules",
    ".mypy_cache", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", ".tox",
  ]);
  const encoder = new TextEncoder();

  function say(text, isError) {
    status.textContent = text;
    status.classList.toggle("field-error", Boolean(isError));
  }

  // The path inside the folder: webkitRelativePath starts with the folder's own name.
  function insidePath(file) {
    const parts = (file.webkitRelativePath || file.name).split("/");
    return parts.length > 1 ? parts.slice(1) : parts;
  }

  // Secrets too: a .env file is the machine's, not the code's (the upload is kept, and staff
  // may download it).
  function kept(parts) {
    const name = parts[parts.length - 1];
    return !parts.some((part) => SKIPPED.has(part)) && !name.endsWith(".pyc") &&
      name !== ".env" && !name.startsWith(".env.");
  }

  function octal(value, width) {
    return value.toString(8).padStart(width - 1, "0") + "\0";
  }

  function put(header, offset, text, width) {
    const bytes = typeof text === "string" ? encoder.encode(text) : text;
    header.set(bytes.subarray(0, width), offset);
  }

  // A ustar header; a path over 100 bytes goes in the 155-byte prefix, cut at a "/".
  function tarHeader(path, size, mtime) {
    const header = new Uint8Array(512);
    let name = encoder.encode(path);
    let prefix = new Uint8Array(0);
    if (name.length > 100) {
      const cut = path.lastIndexOf("/", path.length - 1);
      prefix = encoder.encode(path.slice(0, cut));
      name = encoder.encode(path.slice(cut + 1));
      if (cut < 0 || prefix.length > 155 || name.length > 100) {
        throw new Error("a path is too long to pack: " + path);
      }
    }
    put(header, 0, name, 100);
    put(header, 100, octal(0o644, 8), 8);
    put(header, 108, octal(0, 8), 8);
    put(header, 116, octal(0, 8), 8);
    put(header, 124, octal(size, 12), 12);
    put(header, 136, octal(Math.floor(mtime / 1000), 12), 12);
    put(header, 148, "        ", 8); // the checksum counts its own field as spaces
    put(header, 156, "0", 1);
    put(header, 257, "ustar\0", 6);
    put(header, 263, "00", 2);
    put(header, 345, prefix, 155);
    const sum = header.reduce((total, byte) => total + byte, 0);
    put(header, 148, sum.toString(8).padStart(6, "0") + "\0 ", 8);
    return header;
  }

  async function packFolder(files) {
    const parts = [];
    for (const { file, path } of files) {
      parts.push(tarHeader(path, file.size, file.lastModified), file);
      const pad = (512 - (file.size % 512)) % 512;
      if (pad) parts.push(new Uint8Array(pad));
    }
    parts.push(new Uint8Array(1024)); // the end: two empty blocks
    const stream = new Blob(parts).stream().pipeThrough(new CompressionStream("gzip"));
    return new Response(stream).blob();
  }

  function offerEntrypoints(paths) {
    entrypoints.replaceChildren(
      ...paths.filter((p) => p.endsWith(".py")).sort().slice(0, 200)
        .map((p) => Trainyard.el("option", { value: p }))
    );
  }

  async function send(blob, filename) {
    if (blob.size > bound("max-bytes")) {
      throw new Error("the archive is " + Trainyard.bytesText(blob.size) + ", over the " +
        Trainyard.bytesText(bound("max-bytes")) + " taken");
    }
    const body = new FormData();
    body.append("archive", blob, filename);
    const response = await fetch(set.getAttribute("data-upload-url"), {
      method: "POST", body, credentials: "same-origin",
      headers: { "X-CSRFToken": Trainyard.csrfToken() },
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error || "the upload failed (" + response.status + ")");
    return answer;
  }

  async function upload(make, filename) {
    if (submit) submit.disabled = true;
    say("Packing and uploading…");
    try {
      const answer = await send(await make(), filename);
      code.value = String(answer.id);
      if (codePath) codePath.value = ""; // one code or the other
      say("Uploaded code " + answer.sha256.slice(0, 12) + ": " + answer.files + " files, " +
        Trainyard.bytesText(answer.bytes) + ".");
    } catch (error) {
      code.value = "";
      say("Not uploaded: " + error.message, true);
    } finally {
      if (submit) submit.disabled = false;
    }
  }

  folderInput.addEventListener("change", function () {
    const files = [...folderInput.files]
      .map((file) => ({ file, parts: insidePath(file) }))
      .filter((item) => kept(item.parts))
      .map((item) => ({ file: item.file, path: item.parts.join("/") }));
    const total = files.reduce((sum, item) => sum + item.file.size, 0);
    if (!files.length) return say("Not uploaded: the folder holds no file to run.", true);
    if (files.length > bound("max-files")) {
      return say("Not uploaded: " + files.length + " files, over the " + bound("max-files") +
        " taken.", true);
    }
    if (total > bound("max-unpacked-bytes")) {
      return say("Not uploaded: " + Trainyard.bytesText(total) + " of files, over the " +
        Trainyard.bytesText(bound("max-unpacked-bytes")) + " taken.", true);
    }
    offerEntrypoints(files.map((item) => item.path));
    upload(() => packFolder(files), "code.tar.gz");
  });

  archiveInput.addEventListener("change", function () {
    const [file] = archiveInput.files;
    if (file) upload(async () => file, file.name);
  });

  document.getElementById("code-folder-button").addEventListener("click", () => folderInput.click());
  document.getElementById("code-archive-button").addEventListener("click", () => archiveInput.click());
  // Shown only now: without this script the buttons could do nothing (a folder on the workers
  // still can be named).
  document.getElementById("code-pickers").hidden = false;
})();
