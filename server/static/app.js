// The page: POST /translate for the typed sentences, POST /attention for the chosen one, and
// the cross-attention heatmap drawn on a canvas (rows: target subwords, columns: source
// subwords). Plain JS, no build step, nothing fetched from outside the server.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { attention: null, selected: -1 };

async function api(path, body) {
  const response = await fetch(path, body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function options() {
  return {
    beam_size: Number($("beam").value),
    length_penalty: Number($("length-penalty").value),
  };
}

async function loadInfo() {
  try {
    const info = await api("/info");
    const pair = `${info.source_language || "?"} \u2192 ${info.target_language || "?"}`;
    const parts = [pair, `${(info.parameters / 1e6).toFixed(1)}M parameters`];
    if (info.step != null) parts.push(`step ${info.step}`);
    for (const [split, bleu] of Object.entries(info.test_bleu || {})) {
      if (bleu != null) parts.push(`${split} BLEU ${bleu.toFixed(2)}`);
    }
    $("model-info").textContent = parts.join(" \u00b7 ");
    $("beam").value = info.options.beam_size;
    $("beam").max = info.max_beam;
    $("length-penalty").value = info.options.length_penalty;
  } catch (e) {
    $("model-info").textContent = `model facts unavailable: ${e.message}`;
  }
}

async function translate() {
  const sentences = $("source").value.split("\n").filter((s) => s.trim() !== "");
  showError("");
  if (sentences.length === 0) {
    showError("Type a sentence first.");
    return;
  }
  $("translate").disabled = true;
  $("status").textContent = "translating\u2026";
  try {
    const started = performance.now();
    const data = await api("/translate", { sentences, ...options() });
    const list = $("translations");
    list.replaceChildren();
    data.translations.forEach((text, i) => {
      const item = document.createElement("li");
      const src = document.createElement("span");
      src.className = "src";
      src.textContent = sentences[i];
      const tgt = document.createElement("span");
      tgt.className = "tgt";
      tgt.textContent = text;
      item.append(src, tgt);
      item.addEventListener("click", () => selectSentence(i, sentences[i]));
      list.append(item);
    });
    const ms = Math.round(performance.now() - started);
    $("status").textContent = `${sentences.length} sentence(s) in ${ms} ms`;
    await selectSentence(0, sentences[0]);
  } catch (e) {
    showError(e.message);
    $("status").textContent = "";
  } finally {
    $("translate").disabled = false;
  }
}

async function selectSentence(index, sentence) {
  state.selected = index;
  document.querySelectorAll("#translations li").forEach((li, i) => {
    li.classList.toggle("selected", i === index);
  });
  try {
    const data = await api("/attention", { sentence, ...options() });
    state.attention = data;
    fillSelect($("layer"), data.layers, "layer");
    fillSelect($("head"), data.heads, "head");
    $("attention-panel").hidden = false;
    draw();
  } catch (e) {
    showError(e.message);
  }
}

function fillSelect(select, count, noun) {
  select.replaceChildren(new Option(`mean of ${count} ${noun}s`, "mean"));
  for (let i = 0; i < count; i++) select.append(new Option(`${noun} ${i + 1}`, String(i)));
}

// The (T, S) matrix for the chosen layer and head: one of them, or the mean.
function matrix() {
  const { attention, layers, heads } = state.attention;
  const layer = $("layer").value;
  const head = $("head").value;
  const ls = layer === "mean" ? [...Array(layers).keys()] : [Number(layer)];
  const hs = head === "mean" ? [...Array(heads).keys()] : [Number(head)];
  const first = attention[0][0];
  const out = first.map((row) => row.map(() => 0));
  for (const l of ls) {
    for (const h of hs) {
      attention[l][h].forEach((row, t) => row.forEach((w, s) => { out[t][s] += w; }));
    }
  }
  const n = ls.length * hs.length;
  return out.map((row) => row.map((w) => w / n));
}

// A white-green-blue ramp, 0 = white, 1 = dark blue.
const STOPS = [[255, 255, 255], [199, 233, 180], [65, 182, 196], [34, 94, 168], [8, 29, 88]];
function color(w) {
  const x = Math.min(1, Math.max(0, w)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(x));
  const f = x - i;
  const c = STOPS[i].map((v, k) => Math.round(v + f * (STOPS[i + 1][k] - v)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}

function draw() {
  const { src_pieces: src, tgt_pieces: tgt } = state.attention;
  const weights = matrix();
  const canvas = $("heatmap");
  const ctx = canvas.getContext("2d");
  const font = "13px ui-monospace, monospace";
  ctx.font = font;
  const widest = (pieces) => Math.max(...pieces.map((p) => ctx.measureText(p).width));
  const cell = Math.max(16, Math.min(36, Math.floor(900 / Math.max(src.length, tgt.length))));
  const left = Math.ceil(widest(tgt)) + 12;
  const top = Math.ceil(widest(src) * 0.75) + 18;
  const width = left + cell * src.length + 10;
  const height = top + cell * tgt.length + 10;
  const ratio = window.devicePixelRatio || 1;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  canvas.style.width = `${width}px`;
  canvas.style.height = `${height}px`;
  ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  // Colours span 0 .. the largest weight shown (as matplotlib's imshow scales by default).
  const top_weight = Math.max(1e-6, ...weights.map((row) => Math.max(...row)));
  weights.forEach((row, t) => row.forEach((w, s) => {
    ctx.fillStyle = color(w / top_weight);
    ctx.fillRect(left + s * cell, top + t * cell, cell, cell);
  }));
  ctx.strokeStyle = "#c9ced6";
  ctx.strokeRect(left, top, cell * src.length, cell * tgt.length);
  ctx.font = font;
  ctx.fillStyle = "#1d2330";
  ctx.textBaseline = "middle";
  ctx.textAlign = "right";
  tgt.forEach((p, t) => ctx.fillText(p, left - 6, top + (t + 0.5) * cell));
  src.forEach((p, s) => {  // source pieces slanted above their columns
    ctx.save();
    ctx.translate(left + (s + 0.5) * cell, top - 6);
    ctx.rotate(-Math.PI / 4);
    ctx.textAlign = "left";
    ctx.fillText(p, 0, 0);
    ctx.restore();
  });
  $("scale").textContent = `darkest = ${top_weight.toFixed(2)}`;
  Object.assign(canvas.dataset, {
    rows: String(tgt.length), cols: String(src.length),
    layer: $("layer").value, head: $("head").value,
  });
  canvas.onmousemove = (event) => {
    const box = canvas.getBoundingClientRect();
    const s = Math.floor((event.clientX - box.left - left) / cell);
    const t = Math.floor((event.clientY - box.top - top) / cell);
    const inside = s >= 0 && t >= 0 && s < src.length && t < tgt.length;
    $("cell-info").textContent = inside
      ? `${tgt[t]} \u2190 ${src[s]}: ${weights[t][s].toFixed(3)}` : "";
  };
}

$("translate").addEventListener("click", translate);
$("source").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) translate();
});
$("layer").addEventListener("change", draw);
$("head").addEventListener("change", draw);
loadInfo();
