// The device page: poll GET /api/devices/ and re-render the machine cards.
// Mirrors templates/devices/device_list.html; built with DOM nodes (textContent), never HTML
// strings, because every value comes from a worker's report.
(function () {
  "use strict";

  const root = document.getElementById("devices");
  if (!root) return;
  const apiUrl = root.dataset.apiUrl;
  const pollMs = (Number(root.dataset.pollSeconds) || 5) * 1000;
  const SHM_LOW_BYTES = 1024 ** 3;

  const { el, bytesText } = window.Trainyard;

  function yesNo(value) {
    return value ? "yes" : "no";
  }

  function factList(pairs) {
    const list = el("dl", { class: "facts" });
    for (const [term, description] of pairs) {
      list.append(el("dt", {}, term), el("dd", {}, description));
    }
    return list;
  }

  function table(className, headings, rows) {
    return el("table", { class: className }, [
      el("thead", {}, el("tr", {}, headings.map((h) => el("th", {}, h)))),
      el("tbody", {}, rows.map((cells) => el("tr", {}, cells.map((c) => el("td", {}, c))))),
    ]);
  }

  function torchPairs(torch) {
    if (torch.error) return [["torch", torch.error]];
    const backends = Object.entries(torch.distributed_backends || {}).sort();
    const distributed =
      (torch.distributed_available ? "available" : "not available") +
      backends.map(([name, ok]) => ` · ${name} ${yesNo(ok)}`).join("");
    return [
      ["torch", `${torch.version || "?"}, compiled for CUDA ${torch.cuda_compiled || "none (CPU build)"}`],
      ["torch.distributed", distributed],
    ];
  }

  // The runs running here and what each holds, in the server's words (views.running_holds).
  function holdsSection(now) {
    const holds = now.holds || [];
    if (!holds.length) return [];
    const rows = holds.map((hold) => [
      hold.url ? el("a", { href: hold.url }, hold.label) : hold.label,
      hold.strategy,
      hold.held_text + (hold.ranks_text ? ` (${hold.ranks_text} here)` : ""),
    ]);
    return [table("holds", ["Running here", "Strategy", "Holds"], rows)];
  }

  function gpuSection(report, now) {
    const gpus = report.gpus || [];
    if (!gpus.length) return [];
    const holders = now.gpu_holders || {};
    const rows = gpus.map((gpu) => [
      gpu.index,
      gpu.name || "?",
      gpu.pci_bus_id || "?",
      `${bytesText(gpu.memory_used_bytes)} / ${bytesText(gpu.memory_total_bytes)}`,
      gpu.utilization_percent === null || gpu.utilization_percent === undefined
        ? "?"
        : `${gpu.utilization_percent} %`,
      holders[String(gpu.index)] || "free",
    ]);
    return [
      table("gpus", ["GPU", "Name", "PCI bus", "Memory used / total", "Utilization", "Held by"], rows),
      el(
        "p",
        { class: "muted" },
        "GPU numbers are NVML's (PCI bus order); CUDA_DEVICE_ORDER on this worker: " +
          (report.cuda_device_order || "unset (CUDA numbers fastest first)") + "."
      ),
    ];
  }

  // What the machine can train, as the server shaped it (catalogue.catalogue_card).
  function catalogueSection(c) {
    if (!c) return [];
    const nodes = [el("h3", {}, "Models and data")];
    if (c.note) nodes.push(el("p", { class: "muted catalogue-note" }, c.note));
    nodes.push(
      el("details", { class: "models" }, [
        el("summary", {}, "Models: " + (c.models_text || "none")),
        ...(c.model_groups || []).map((g) =>
          el("p", {}, [el("strong", {}, g.source), ": " + g.models.join(", ")])
        ),
      ])
    );
    const datasets = c.datasets || [];
    if (datasets.length) {
      const rows = datasets.map((d) => [d.name, d.where, d.size_text, d.source]);
      nodes.push(table("datasets", ["Dataset", "Where", "Size", "From"], rows));
    }
    const folders = c.image_folders || [];
    if (folders.length) {
      const rows = folders.map((f) => [f.path, f.classes, f.images, f.size_text, f.layout]);
      nodes.push(table("image-folders", ["Image folder", "Classes", "Images", "Size", "Layout"], rows));
    } else {
      nodes.push(
        el("p", { class: "muted" },
          "No image folder: put one under <data dir>/imagefolders or $TRAINYARD_IMAGE_FOLDERS on this worker.")
      );
    }
    // A language model's text (the users' .txt folders, for the textfolder dataset).
    const texts = c.text_folders || [];
    if (texts.length) {
      const rows = texts.map((f) => [f.path, f.files, f.size_text, f.layout]);
      nodes.push(table("text-folders", ["Text folder", "Files", "Size", "Layout"], rows));
    }
    return nodes;
  }

  function shmSection(shm, now) {
    const nodes = [el("h3", {}, "Shared memory")];
    if (shm.present) {
      nodes.push(
        factList([
          [
            shm.path,
            `${bytesText(shm.total_bytes)} · ${bytesText(shm.used_bytes)} used · ${bytesText(shm.free_bytes)} free`,
          ],
          ["Sharing strategy", shm.sharing_strategy || "?"],
          ["Strategies available", (shm.sharing_strategies || []).join(", ") || "?"],
          ["Sharing a tensor", now.sharing_text],
        ])
      );
      if (shm.total_bytes !== undefined && shm.total_bytes < SHM_LOW_BYTES) {
        nodes.push(
          el("p", { class: "hint warning" }, [
            `${shm.path} has only ${bytesText(shm.total_bytes)}: DataLoader workers that pass ` +
              'batches through it die with "Bus error". In Docker the default is 64 MB; start ' +
              "the container with ",
            el("code", {}, "--shm-size=2g"),
            " (or ",
            el("code", {}, "--ipc=host"),
            ").",
          ])
        );
      }
    } else {
      nodes.push(el("p", {}, shm.status || "shared memory not reported"));
    }
    return nodes;
  }

  // The shared tensors of the runs running on this machine (the server names only the runs
  // this user may open).
  function runTensorsSection(runs) {
    const nodes = [el("h3", {}, "Shared tensors of running runs")];
    const rows = [];
    for (const run of runs || []) {
      const label = run.url
        ? el("a", { href: run.url }, `#${run.id} ${run.name}`)
        : "another user's run";
      (run.shared_tensors || []).forEach((t, index) => {
        rows.push([
          index === 0 ? el("span", {}, [label, ` (${run.strategy}, ${run.shared_text} shared${run.ranks_text ? `, ${run.ranks_text} here` : ""})`]) : "",
          t.name,
          yesNo(t.is_shared),
          t.dtype || "",
          (t.shape || []).join(" × "),
          t.bytes_text || bytesText(t.bytes),
        ]);
      });
    }
    if (rows.length) {
      nodes.push(
        table("shared-tensors run-tensors", ["Run", "Shared tensor", "is_shared", "dtype", "shape", "bytes"], rows)
      );
    } else {
      nodes.push(el("p", { class: "muted" }, "No run on this machine reports shared tensors now."));
    }
    return nodes;
  }

  function machineCard(machine) {
    const report = machine.report || {};
    const memory = report.memory || {};
    const gpus = report.gpus || [];
    const now = machine.now || {};
    const gpuStatus = now.gpu_status_text;
    return el("section", { class: "card machine", "data-hostname": machine.hostname }, [
      el("header", { class: "machine-head" }, [
        el("h2", {}, machine.hostname),
        " ",
        el("span", { class: `badge ${machine.online ? "online" : "offline"}` }, machine.online ? "online" : "offline"),
        " ",
        el("span", { class: "muted" }, `last report ${machine.age_seconds} s ago`),
      ]),
      factList([
        ["Address", `${machine.address || "not reported"} · queue machine.${machine.hostname}`],
        ["CPU cores", report.cpu_count ?? "?"],
        ["Memory", `${bytesText(memory.available_bytes)} available of ${bytesText(memory.total_bytes)}`],
        ["CPU busy", now.cpu_busy_text],
        ["GPUs", gpus.length ? `${gpus.length} (${gpuStatus})` : gpuStatus],
        ["Held now", now.held_text],
        ...torchPairs(report.torch || {}),
      ]),
      ...holdsSection(now),
      ...gpuSection(report, now),
      ...catalogueSection(machine.catalogue),
      ...shmSection(report.shared_memory || {}, now),
      ...runTensorsSection(machine.runs),
    ]);
  }

  function render(machines) {
    if (!machines.length) {
      root.replaceChildren(
        el("p", { class: "empty" }, [
          "No worker has reported yet: start one with ",
          el("code", {}, "celery -A dashboard worker"),
          ".",
        ])
      );
      return;
    }
    root.replaceChildren(...machines.map(machineCard));
  }

  async function refresh() {
    try {
      const response = await fetch(apiUrl, {
        headers: { Accept: "application/json" },
        credentials: "same-origin",
      });
      if (response.ok) {
        render((await response.json()).machines || []);
      }
      // Not ok (logged out, server restarting): keep the last cards and try again later.
    } catch (error) {
      console.warn("device refresh failed", error);
    } finally {
      setTimeout(refresh, pollMs);
    }
  }

  setTimeout(refresh, pollMs);
})();
