"use strict";
// The page of `sam3track serve`. It speaks the JSON API of docs/api.md ("The web server") and draws
// each frame's masks, decoded from COCO RLE, over the frame. No build step, no library.

const $ = (id) => document.getElementById(id);
const IMAGE_CACHE = 48; // decoded frames kept for scrubbing back and forth
const state = {
  info: null,
  session: null, // start_session's answer: session_id, name, num_frames, width, height, fps
  frame: 0,
  outputs: new Map(), // frame -> the latest outputs for it (JSON form of the official outputs)
  images: new Map(), // frame -> ImageBitmap
  objects: new Set(), // ids tracked now
  target: null, // the object the next click or box refines; null: a new object
  maxId: -1, // ids are never reused: a new object takes maxId + 1
  prompts: new Map(), // "obj/frame" -> {points, labels, box}: sent whole (clear_old_points)
  stream: null, // AbortController of the propagation running
  drag: null, // where a box drag started
};

// ------------------------------------------------------------------------------------ the API
async function call(path, body) {
  const init = body === undefined ? {} : {
    method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(body),
  };
  const res = await fetch(path, init);
  const data = await res.json().catch(() => ({error: `HTTP ${res.status} from ${path}`}));
  if (!res.ok) throw new Error(data.error || `HTTP ${res.status}`);
  return data;
}

function request(type, fields) {
  return call(`/api/${type}`, {session_id: state.session.session_id, ...fields});
}

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").classList.toggle("error", isError);
}

async function busy(label, work) {
  document.body.dataset.state = "busy";
  updateControls();
  setStatus(`${label}…`);
  try {
    await work();
  } catch (e) {
    setStatus(e.message, true);
  } finally {
    document.body.dataset.state = "idle";
    updateControls();
  }
}

// ------------------------------------------------------------------------------- masks (RLE)
function rleCounts(s) {
  // COCO's compressed counts (pycocotools rleFrString): 5 bits a character, deltas from index 3
  const counts = [];
  let p = 0;
  while (p < s.length) {
    let x = 0, k = 0, more = true;
    while (more) {
      const c = s.charCodeAt(p++) - 48;
      x |= (c & 0x1f) << (5 * k);
      more = (c & 0x20) !== 0;
      k++;
      if (!more && (c & 0x10)) x |= -1 << (5 * k);
    }
    if (counts.length > 2) x += counts[counts.length - 2];
    counts.push(x);
  }
  return counts;
}

function colour(id) {
  const palette = state.info.palette;
  return palette[id % palette.length];
}

function paintMasks() {
  const canvas = $("mask-canvas"), ctx = canvas.getContext("2d");
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const out = state.outputs.get(state.frame);
  if (!out || out.out_obj_ids.length === 0) return;
  const W = canvas.width, H = canvas.height, image = ctx.createImageData(W, H), px = image.data;
  out.out_obj_ids.forEach((id, i) => {
    const [r, g, b] = colour(id);
    let pos = 0;
    rleCounts(out.out_binary_masks[i].counts).forEach((run, j) => {
      if (j % 2) {
        for (let q = pos; q < pos + run; q++) { // column-major, as COCO RLE runs
          const y = q % H, o = (y * W + (q - y) / H) * 4;
          px[o] = r; px[o + 1] = g; px[o + 2] = b; px[o + 3] = 140;
        }
      }
      pos += run;
    });
  });
  ctx.putImageData(image, 0, 0);
  paintLabels(ctx, out, W, H);
}

function paintLabels(ctx, out, W, H) {
  ctx.font = `${Math.max(10, Math.round(H / 28))}px sans-serif`;
  ctx.textBaseline = "top";
  out.out_obj_ids.forEach((id, i) => {
    const box = out.out_boxes_xywh[i];
    if (!box || box.some((v) => v === null)) return;
    const x = box[0] * W, y = box[1] * H, text = `id ${id}`, w = ctx.measureText(text).width + 6;
    const [r, g, b] = colour(id);
    ctx.fillStyle = `rgb(${r},${g},${b})`;
    ctx.fillRect(x, y, w, parseInt(ctx.font) + 4);
    ctx.fillStyle = 0.299 * r + 0.587 * g + 0.114 * b > 140 ? "#000" : "#fff";
    ctx.fillText(text, x + 3, y + 2);
  });
}

function paintMarks(dragTo) {
  const canvas = $("marks-canvas"), ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, radius = Math.max(3, W / 120);
  ctx.clearRect(0, 0, W, H);
  ctx.lineWidth = Math.max(1.5, W / 400);
  for (const [key, p] of state.prompts) {
    const [obj, frame] = key.split("/").map(Number);
    if (frame !== state.frame) continue;
    const [r, g, b] = colour(obj);
    ctx.strokeStyle = `rgb(${r},${g},${b})`;
    if (p.box) ctx.strokeRect(p.box[0] * W, p.box[1] * H, p.box[2] * W, p.box[3] * H);
    p.points.forEach(([x, y], i) => {
      ctx.beginPath();
      ctx.arc(x * W, y * H, radius, 0, 2 * Math.PI);
      ctx.fillStyle = p.labels[i] ? "#2ecc40" : "#ff4136";
      ctx.fill();
      ctx.stroke();
    });
  }
  if (state.drag && dragTo) {
    ctx.strokeStyle = "#fff";
    ctx.setLineDash([4, 3]);
    const [x0, y0] = state.drag;
    ctx.strokeRect(x0 * W, y0 * H, (dragTo[0] - x0) * W, (dragTo[1] - y0) * H);
    ctx.setLineDash([]);
  }
}

// --------------------------------------------------------------------------------- frames
async function frameImage(i) {
  if (state.images.has(i)) return state.images.get(i);
  const sid = state.session.session_id;
  const res = await fetch(`/api/sessions/${sid}/frames/${i}`);
  if (!res.ok || !state.session || state.session.session_id !== sid) return null;
  const bitmap = await createImageBitmap(await res.blob());
  state.images.set(i, bitmap);
  if (state.images.size > IMAGE_CACHE) {
    const oldest = state.images.keys().next().value;
    state.images.get(oldest).close();
    state.images.delete(oldest);
  }
  return bitmap;
}

async function showFrame(i) {
  if (!state.session) return;
  state.frame = Math.max(0, Math.min(i, state.session.num_frames - 1));
  $("scrubber").value = state.frame;
  $("frame-label").textContent = `frame ${state.frame} / ${state.session.num_frames - 1}`;
  paintMasks();
  paintMarks();
  const shown = state.frame, bitmap = await frameImage(shown);
  if (bitmap && state.frame === shown) $("frame-canvas").getContext("2d").drawImage(bitmap, 0, 0);
}

let pendingFrame = null, drawing = false;
async function followFrame(i) { // while masks stream in: show the newest frame, one draw at a time
  pendingFrame = i;
  if (drawing) return;
  drawing = true;
  while (pendingFrame !== null) {
    const f = pendingFrame;
    pendingFrame = null;
    await showFrame(f);
  }
  drawing = false;
}

// ------------------------------------------------------------------------------- sessions
function takeResponse(response) {
  if (!response.outputs) return;
  state.outputs.set(response.frame_index, response.outputs);
  for (const id of response.outputs.out_obj_ids) {
    state.objects.add(id);
    state.maxId = Math.max(state.maxId, id);
  }
  renderObjects();
}

function forgetOutputs() {
  state.outputs.clear();
  state.objects.clear();
  state.prompts.clear();
  state.target = null;
  renderObjects();
}

async function openSession(start, label) {
  await busy(`opening ${label}`, async () => {
    await closeSession();
    const info = await start();
    state.session = info;
    state.images.clear();
    forgetOutputs();
    for (const id of ["frame-canvas", "mask-canvas", "marks-canvas"]) {
      $(id).width = info.width;
      $(id).height = info.height;
    }
    $("scrubber").max = info.num_frames - 1;
    $("video-info").textContent = `${info.name}: ${info.num_frames} frames, ${info.width}×${info.height}, ` +
      `${info.fps.toFixed(2)} fps`;
    await showFrame(0);
    setStatus(`opened ${info.name}`);
  });
}

async function closeSession() {
  if (!state.session) return;
  const sid = state.session.session_id;
  state.session = null;
  forgetOutputs();
  $("video-info").textContent = "";
  await call("/api/close_session", {session_id: sid}).catch(() => {});
}

function renderObjects() {
  const list = $("objects");
  list.replaceChildren();
  for (const id of [...state.objects].sort((a, b) => a - b)) {
    const item = document.createElement("li"), swatch = document.createElement("span");
    const [r, g, b] = colour(id);
    swatch.className = "swatch";
    swatch.style.background = `rgb(${r},${g},${b})`;
    const remove = document.createElement("button");
    remove.textContent = "Remove";
    remove.addEventListener("click", (e) => { e.stopPropagation(); removeObject(id); });
    item.append(swatch, `id ${id}`, remove);
    item.dataset.id = id;
    item.classList.toggle("selected", state.target === id);
    item.addEventListener("click", () => { state.target = id; renderObjects(); });
    list.append(item);
  }
  $("target").textContent = state.target === null ? "a new object" : `object ${state.target} (refine)`;
  updateControls();
}

// -------------------------------------------------------------------------------- prompts
function findText() {
  const texts = $("prompt").value.split(",").map((t) => t.trim()).filter(Boolean);
  if (texts.length === 0) { setStatus("type what to find, e.g. person", true); return; }
  busy(`finding ${texts.join(", ")}`, async () => {
    const text = texts.length === 1 ? texts[0] : texts; // several: sam3track's list extension
    const response = await request("add_prompt", {frame_index: state.frame, text});
    forgetOutputs(); // a text prompt starts over, as in the official API
    takeResponse(response);
    await showFrame(state.frame);
    setStatus(`found ${response.outputs.out_obj_ids.length} object(s) for ${texts.join(", ")} on frame ${state.frame}`);
  });
}

async function prompt(change) { // a click or a box on the current frame, for the target object
  const obj = state.target === null ? state.maxId + 1 : state.target, key = `${obj}/${state.frame}`;
  const old = state.prompts.get(key) || {points: [], labels: [], box: null};
  const next = change({points: [...old.points], labels: [...old.labels], box: old.box});
  const fields = {frame_index: state.frame, obj_id: obj, clear_old_points: true};
  if (next.points.length) Object.assign(fields, {points: next.points, point_labels: next.labels});
  if (next.box) Object.assign(fields, {bounding_boxes: [next.box], bounding_box_labels: [1]});
  await busy(`prompting object ${obj}`, async () => {
    const response = await request("add_prompt", fields);
    state.prompts.set(key, next);
    state.target = obj;
    // the prompted object exists even when its mask is empty (Meta's output then leaves it out):
    // listed, and its id never given to the next new object
    state.objects.add(obj);
    state.maxId = Math.max(state.maxId, obj);
    takeResponse(response);
    await showFrame(state.frame);
    setStatus(`object ${obj} on frame ${state.frame}: ${next.points.length} click(s)${next.box ? " and a box" : ""}`);
  });
}

function relative(event) {
  const rect = $("marks-canvas").getBoundingClientRect();
  const clamp = (v) => Math.max(0, Math.min(1, v));
  return [clamp((event.clientX - rect.left) / rect.width), clamp((event.clientY - rect.top) / rect.height)];
}

function tool() { return document.querySelector("input[name=tool]:checked").value; }

function onPointerUp(event) {
  if (!state.session || document.body.dataset.state !== "idle") return;
  const at = relative(event), from = state.drag;
  state.drag = null;
  if (tool() === "box") {
    if (!from) return;
    const x = Math.min(from[0], at[0]), y = Math.min(from[1], at[1]);
    const w = Math.abs(at[0] - from[0]), h = Math.abs(at[1] - from[1]);
    if (w < 0.005 || h < 0.005) { paintMarks(); setStatus("drag to draw a box", true); return; }
    prompt(() => ({points: [], labels: [], box: [x, y, w, h]})); // a box comes first on a frame
  } else {
    const label = tool() === "positive" ? 1 : 0;
    prompt((p) => { p.points.push(at); p.labels.push(label); return p; });
  }
}

async function removeObject(id) {
  await busy(`removing object ${id}`, async () => {
    await request("remove_object", {obj_id: id, frame_index: state.frame});
    state.objects.delete(id);
    for (const [frame, out] of state.outputs) {
      const keep = out.out_obj_ids.map((o, i) => (o === id ? -1 : i)).filter((i) => i >= 0);
      const pick = (values) => keep.map((i) => values[i]);
      state.outputs.set(frame, {...out, out_obj_ids: pick(out.out_obj_ids), out_probs: pick(out.out_probs),
        out_boxes_xywh: pick(out.out_boxes_xywh), out_binary_masks: pick(out.out_binary_masks)});
    }
    for (const key of [...state.prompts.keys()]) if (key.startsWith(`${id}/`)) state.prompts.delete(key);
    if (state.target === id) state.target = null;
    renderObjects();
    await showFrame(state.frame);
    setStatus(`removed object ${id}`);
  });
}

// ------------------------------------------------------------------------------ propagation
async function propagate(direction) {
  const controller = new AbortController(), progress = $("progress");
  state.stream = controller;
  document.body.dataset.state = "propagating";
  updateControls();
  progress.value = 0;
  setStatus(`propagating ${direction}…`);
  try {
    const res = await fetch("/api/propagate_in_video", {
      method: "POST", headers: {"Content-Type": "application/json"}, signal: controller.signal,
      body: JSON.stringify({session_id: state.session.session_id, propagation_direction: direction}),
    });
    if (!res.ok) throw new Error((await res.json().catch(() => ({}))).error || `HTTP ${res.status}`);
    const reader = res.body.getReader(), decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, {stream: true});
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        onEvent(buffer.slice(0, cut));
        buffer = buffer.slice(cut + 2);
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") setStatus(e.message, true);
  } finally {
    state.stream = null;
    document.body.dataset.state = "idle";
    updateControls();
  }
}

function onEvent(block) { // one server-sent event
  let event = "message", data = "";
  for (const line of block.split("\n")) {
    if (line.startsWith("event: ")) event = line.slice(7);
    else if (line.startsWith("data: ")) data += line.slice(6);
  }
  const message = JSON.parse(data), progress = $("progress");
  if (event === "start") {
    progress.max = Math.max(1, message.total);
    $("progress-text").textContent = `0 / ${message.total} frames`;
  } else if (event === "message") {
    takeResponse(message);
    progress.value = message.done;
    $("progress-text").textContent = `${message.done} / ${message.total} frames`;
    followFrame(message.frame_index);
  } else if (event === "done") {
    progress.value = progress.max;
    setStatus(`propagated ${message.frames} frames`);
  } else if (event === "error") {
    setStatus(message.error, true);
  }
}

function stop() {
  if (state.stream) state.stream.abort(); // the server ends the propagation when the stream closes
  setStatus("stopped");
}

// -------------------------------------------------------------------------------- controls
function updateControls() {
  const open = state.session !== null, idle = document.body.dataset.state === "idle";
  for (const id of ["find", "reset", "close", "propagate-backward", "propagate-both", "propagate-forward"]) {
    $(id).disabled = !open || !idle;
  }
  $("stop").disabled = state.stream === null;
  const ready = open && idle && state.outputs.size > 0;
  const downloads = [["download-mp4", "masks.mp4"], ["download-json", "results.json"], ["download-png", "masks.zip"]];
  for (const [id, kind] of downloads) {
    $(id).classList.toggle("disabled", !ready);
    if (ready) $(id).href = `/api/sessions/${state.session.session_id}/download/${kind}`;
    else $(id).removeAttribute("href");
  }
}

function wire() {
  $("open").addEventListener("click", () => {
    const path = $("video-list").value;
    if (path) openSession(() => call("/api/start_session", {resource_path: path}), path);
  });
  $("upload").addEventListener("change", () => {
    const file = $("upload").files[0];
    if (!file) return;
    openSession(async () => {
      const res = await fetch(`/api/upload?filename=${encodeURIComponent(file.name)}`, {
        method: "POST", headers: {"Content-Type": "application/octet-stream"}, body: file});
      const data = await res.json().catch(() => ({error: `HTTP ${res.status}`}));
      if (!res.ok) throw new Error(data.error);
      return data;
    }, file.name);
  });
  $("find").addEventListener("click", findText);
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !$("find").disabled) findText(); });
  $("new-object").addEventListener("click", () => { state.target = null; renderObjects(); });
  for (const direction of ["forward", "backward", "both"]) {
    $(`propagate-${direction}`).addEventListener("click", () => propagate(direction));
  }
  $("stop").addEventListener("click", stop);
  $("reset").addEventListener("click", () => busy("resetting", async () => {
    await request("reset_session", {});
    forgetOutputs();
    await showFrame(state.frame);
    setStatus("reset: no prompts, no objects");
  }));
  $("close").addEventListener("click", () => busy("closing", async () => {
    await closeSession();
    for (const id of ["frame-canvas", "mask-canvas", "marks-canvas"]) {
      $(id).getContext("2d").clearRect(0, 0, $(id).width, $(id).height);
    }
    setStatus("closed; open a video");
  }));
  wireFrames();
}

function wireFrames() {
  const marks = $("marks-canvas");
  marks.addEventListener("pointerdown", (e) => { if (state.session) state.drag = relative(e); });
  marks.addEventListener("pointermove", (e) => { if (state.drag && tool() === "box") paintMarks(relative(e)); });
  marks.addEventListener("pointerup", onPointerUp);
  $("scrubber").addEventListener("input", () => showFrame(Number($("scrubber").value)));
  $("prev").addEventListener("click", () => showFrame(state.frame - 1));
  $("next").addEventListener("click", () => showFrame(state.frame + 1));
  document.addEventListener("keydown", (e) => {
    if (e.target.tagName === "INPUT" && e.target.type === "text") return;
    if (e.key === "ArrowLeft") showFrame(state.frame - 1);
    if (e.key === "ArrowRight") showFrame(state.frame + 1);
  });
  window.addEventListener("pagehide", () => { // the server would close it when idle anyway
    if (state.session) {
      fetch("/api/close_session", {method: "POST", keepalive: true, headers: {"Content-Type": "application/json"},
        body: JSON.stringify({session_id: state.session.session_id})});
    }
  });
}

async function init() {
  wire();
  updateControls();
  try {
    state.info = await call("/api/info");
    $("bundle").textContent = `bundle ${state.info.bundle}`;
    const list = $("video-list");
    const videos = state.info.root ? (await call("/api/videos")).videos : [];
    for (const video of videos) list.append(new Option(video.path, video.path));
    if (videos.length === 0) {
      list.append(new Option(state.info.root ? "no video under --root" : "no --root: upload", ""));
    }
    setStatus("open a video");
  } catch (e) {
    setStatus(e.message, true);
  }
}

init();
