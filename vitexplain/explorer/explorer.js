/* vitexplain explorer: draws each map over its image on a canvas, from the data embedded in the page.
   The encodings and colour scales are described in vitexplain/explorer/__init__.py and
   docs/decisions/explorer.md. */
"use strict";
(() => {
  const DATA = JSON.parse(document.getElementById("explorer-data").textContent);
  const PALETTE_LAST = 256;           // palettes have 257 colours; 128 is the centre of a diverging one
  const SINGLE_SIZE = 448;            // CSS pixels of the longer image side: one map
  const COMPARE_SIZE = 224;           // ... and each map in compare mode
  const $ = (id) => document.getElementById(id);
  const state = {item: 0, method: null, compare: false, hidden: new Set(), opacity: 0.6,
                 interpolation: "nearest", sequential: 0, diverging: 0};
  let panels = [];                    // the panels drawn now: {map, canvas, readout, marker, cursor}
  let layout = "";                    // what the panels were built for; rebuilt only when it changes

  /* ---------- decoding ---------- */

  function bytesOf(base64) {
    const text = atob(base64);
    const bytes = new Uint8Array(text.length);
    for (let i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
    return bytes;
  }

  async function inflate(base64) {
    const stream = new Blob([bytesOf(base64)]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Uint8Array(await new Response(stream).arrayBuffer());
  }

  /* 16-bit levels, stored as residuals of the prediction left + up - up-left (high bytes, then low
     bytes) -> raw values. */
  async function decodeMap(map) {
    const planes = await inflate(map.levels);
    const {rows, cols} = map;
    const n = rows * cols;
    const levels = new Uint16Array(n);
    for (let y = 0; y < rows; y++) {
      for (let x = 0; x < cols; x++) {
        const i = y * cols + x;
        const left = x > 0 ? levels[i - 1] : 0, up = y > 0 ? levels[i - cols] : 0;
        const prediction = x > 0 && y > 0 ? left + up - levels[i - cols - 1] : x > 0 ? left : up;
        levels[i] = (((planes[i] << 8) | planes[n + i]) + prediction) & 0xffff;
      }
    }
    map.values = Float64Array.from(levels, (level) => map.base + (level - map.zero) * map.step);
    map.cache = {};
    delete map.levels;
  }

  /* The image's RGBA pixels, read back from a canvas once. */
  async function decodeImage(item) {
    const image = new Image();
    image.src = item.image;
    await image.decode();
    const canvas = document.createElement("canvas");
    canvas.width = item.width;
    canvas.height = item.height;
    const context = canvas.getContext("2d");
    context.drawImage(image, 0, 0);
    item.pixels = context.getImageData(0, 0, item.width, item.height).data;
  }

  /* ---------- colours ---------- */

  function palette(map) {
    return map.signed ? DATA.palettes.diverging[state.diverging] : DATA.palettes.sequential[state.sequential];
  }

  /* Where a value falls on the palette, 0 … 1 (clipped by colourIndex): between the ends computed in
     Python (vitexplain.viz.map_scale), 0 at the centre of a signed map's diverging palette. */
  function scaler(map) {
    const {low, high} = map.scale;
    if (map.signed) return high > 0 ? (value) => 0.5 + value / (2 * high) : () => 0.5;
    return high > low ? (value) => (value - low) / (high - low) : () => 0;
  }

  function colourIndex(t) {
    return Math.min(PALETTE_LAST, Math.max(0, Math.round(t * PALETTE_LAST)));
  }

  /* Palette index of every image pixel: the map upsampled to the image (nearest or bilinear,
     align_corners=False as torch's interpolate), cached per map and interpolation. */
  function indices(item, map) {
    const key = state.interpolation;
    if (map.cache[key]) return map.cache[key];
    const {width, height} = item;
    const {rows, cols, values} = map;
    const place = scaler(map);
    const out = new Uint16Array(width * height);
    if (key === "nearest") {
      for (let y = 0; y < height; y++) {
        const row = Math.floor(y * rows / height) * cols;
        for (let x = 0; x < width; x++) {
          out[y * width + x] = colourIndex(place(values[row + Math.floor(x * cols / width)]));
        }
      }
    } else {
      const axis = (size, cells) => Array.from({length: size}, (_, i) => {
        const at = Math.max(0, (i + 0.5) * cells / size - 0.5);
        const low = Math.min(Math.floor(at), cells - 1);
        return [low, Math.min(low + 1, cells - 1), at - low];
      });
      const ys = axis(height, rows), xs = axis(width, cols);
      for (let y = 0; y < height; y++) {
        const [y0, y1, wy] = ys[y];
        for (let x = 0; x < width; x++) {
          const [x0, x1, wx] = xs[x];
          const top = values[y0 * cols + x0] * (1 - wx) + values[y0 * cols + x1] * wx;
          const bottom = values[y1 * cols + x0] * (1 - wx) + values[y1 * cols + x1] * wx;
          out[y * width + x] = colourIndex(place(top * (1 - wy) + bottom * wy));
        }
      }
    }
    map.cache[key] = out;
    return out;
  }

  function draw(item, panel) {
    const {width, height, pixels} = item;
    const rgb = palette(panel.map).colours;
    const index = indices(item, panel.map);
    const context = panel.canvas.getContext("2d");
    const blended = context.createImageData(width, height);
    const out = blended.data, alpha = state.opacity;
    for (let i = 0; i < width * height; i++) {
      const colour = 3 * index[i];
      for (let c = 0; c < 3; c++) out[4 * i + c] = pixels[4 * i + c] * (1 - alpha) + rgb[colour + c] * alpha;
      out[4 * i + 3] = 255;
    }
    context.putImageData(blended, 0, 0);
    drawColourBar(panel);
  }

  /* A value with `digits` significant digits (6 for read-outs: finer than the 16-bit encoding's error). */
  function format(value, digits = 6) {
    if (value === 0) return "0";
    const magnitude = Math.abs(value);
    if (magnitude >= 1e-3 && magnitude < 1e5) return String(Number(value.toPrecision(digits)));
    return value.toExponential(digits - 1);
  }

  function drawColourBar(panel) {
    const {map} = panel;
    const rgb = palette(map).colours;
    const context = panel.bar.getContext("2d");
    const strip = context.createImageData(PALETTE_LAST + 1, 1);
    for (let i = 0; i <= PALETTE_LAST; i++) {
      for (let c = 0; c < 3; c++) strip.data[4 * i + c] = rgb[3 * i + c];
      strip.data[4 * i + 3] = 255;
    }
    context.putImageData(strip, 0, 0);
    const {low, high, rule} = map.scale;
    const ends = [map.low < low ? "≤ " : "", "", map.high > high ? "≥ " : ""];     // saturated beyond the ends
    const ticks = [low, map.signed ? 0 : (low + high) / 2, high];
    panel.ticks.forEach((tick, i) => { tick.textContent = ends[i] + format(ticks[i], 4); });
    panel.scale.textContent = `${palette(map).label}: ${rule}; map range ${format(map.low, 4)} … ${format(map.high, 4)}`;
  }

  /* ---------- reading values ---------- */

  /* The map's cell (token, pixel or cell) that covers image pixel (x, y). */
  function cellAt(item, map, x, y) {
    return {row: Math.floor(y * map.rows / item.height), col: Math.floor(x * map.cols / item.width)};
  }

  /* The cell under image pixel (x, y): where it is, as text, and its raw value. */
  function describe(item, map, x, y) {
    const {row, col} = cellAt(item, map, x, y);
    const value = format(map.values[row * map.cols + col]);
    const place = {token: `token (row ${row}, col ${col}): `, pixel: `pixel (y ${row}, x ${col}): `,
                   cell: `cell (row ${row}, col ${col}) of ${map.rows}×${map.cols}: `}[map.kind];
    return {row, col, place, value};
  }

  /* Show the value at image pixel (x, y) in every panel, so compared maps are read at the same place. */
  function pointAt(x, y) {
    const item = DATA.items[state.item];
    for (const panel of panels) {
      const {row, col, place, value} = describe(item, panel.map, x, y);
      panel.readout.replaceChildren(place, element("span", {className: "value", textContent: value}));
      panel.readout.classList.remove("idle");
      const cellWidth = panel.canvas.clientWidth / panel.map.cols;
      const cellHeight = panel.canvas.clientHeight / panel.map.rows;
      Object.assign(panel.marker.style, {left: `${col * cellWidth}px`, top: `${row * cellHeight}px`,
                                          width: `${cellWidth}px`, height: `${cellHeight}px`});
      panel.marker.hidden = false;
    }
  }

  function clearPoint() {
    for (const panel of panels) {
      panel.readout.textContent = "hover the map to read values";
      panel.readout.classList.add("idle");
      panel.marker.hidden = true;
    }
  }

  function onMove(panel, event) {
    const item = DATA.items[state.item];
    const pixel = (offset, shown, size) => Math.min(size - 1, Math.max(0, Math.floor(offset * size / shown)));
    const x = pixel(event.offsetX, panel.canvas.clientWidth, item.width);
    const y = pixel(event.offsetY, panel.canvas.clientHeight, item.height);
    panel.cursor = cellAt(item, panel.map, x, y);
    pointAt(x, y);
  }

  /* Arrow keys move a cursor by one cell of the focused map (ten with Shift). */
  function onKey(panel, event) {
    const moves = {ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1]};
    if (!(event.key in moves)) return;
    event.preventDefault();
    const step = event.shiftKey ? 10 : 1;
    const {rows, cols} = panel.map;
    const cursor = panel.cursor || {row: 0, col: 0};
    panel.cursor = {row: Math.min(rows - 1, Math.max(0, cursor.row + moves[event.key][0] * step)),
                    col: Math.min(cols - 1, Math.max(0, cursor.col + moves[event.key][1] * step))};
    showCursor(panel);
  }

  /* Read the focused map at its keyboard cursor (the top-left cell at first). */
  function showCursor(panel) {
    const item = DATA.items[state.item];
    panel.cursor = panel.cursor || {row: 0, col: 0};
    const {row, col} = panel.cursor;
    pointAt(Math.floor((col + 0.5) * item.width / panel.map.cols), Math.floor((row + 0.5) * item.height / panel.map.rows));
  }

  /* ---------- building the page ---------- */

  function element(tag, properties = {}, children = []) {
    const node = Object.assign(document.createElement(tag), properties);
    node.append(...children);
    return node;
  }

  /* A label that may wrap only after "(", "=", ",", "_", "-" or at a space, never inside a word
     (method labels such as "gradtoken(transpose=True)", image names such as "digits_vit · digits-test-7"). */
  function breakable(text) {
    return text.split(/(?<=[(=,_-])/).flatMap((part, i) => (i ? [element("wbr"), part] : [part]));
  }

  function optionsTable(options) {
    const keys = Object.keys(options);
    if (!keys.length) return element("p", {className: "options none", textContent: "no options recorded"});
    return element("table", {className: "options"}, [element("tbody", {}, keys.map((key) => element("tr", {}, [
      element("th", {scope: "row", textContent: key}),
      element("td", {textContent: typeof options[key] === "string" ? options[key] : JSON.stringify(options[key])}),
    ])))]);
  }

  function buildPanel(item, map, size) {
    const scale = Math.max(item.width, item.height) > size ? size / Math.max(item.width, item.height)
      : Math.floor(size / Math.max(item.width, item.height));
    const canvas = element("canvas", {width: item.width, height: item.height, tabIndex: 0, className: "map"});
    canvas.style.width = `${item.width * scale}px`;
    canvas.dataset.method = map.label;
    canvas.setAttribute("aria-label", `${map.label} over ${item.name}: focus and use the arrow keys to read values`);
    const marker = element("div", {className: "marker", hidden: true});
    const bar = element("canvas", {width: PALETTE_LAST + 1, height: 1, className: "bar"});
    const ticks = [0, 1, 2].map(() => element("span"));
    const readout = element("output", {className: "readout", ariaLive: "polite"});
    const panel = {map, canvas, marker, bar, ticks, readout, cursor: null, scale: element("p", {className: "scale"})};
    canvas.addEventListener("mousemove", (event) => onMove(panel, event));
    canvas.addEventListener("mouseleave", clearPoint);
    canvas.addEventListener("keydown", (event) => onKey(panel, event));
    canvas.addEventListener("focus", () => showCursor(panel));
    canvas.addEventListener("blur", clearPoint);
    const kind = {token: `token map ${map.rows}×${map.cols}`, pixel: `pixel map ${map.rows}×${map.cols}`,
                  cell: `map ${map.rows}×${map.cols}, drawn over the image`}[map.kind];
    panel.node = element("figure", {className: "panel"}, [
      element("figcaption", {}, [element("strong", {}, breakable(map.label)),
                                 element("span", {className: "kind", textContent: kind})]),
      element("div", {className: "stage"}, [canvas, marker]),
      element("div", {className: "colourbar"}, [bar, element("div", {className: "ticks"}, ticks)]),
      panel.scale, readout,
      element("details", {open: !state.compare, className: "options"},
              [element("summary", {textContent: "options"}), optionsTable(map.options)]),
    ]);
    panel.node.style.width = `${Math.max(item.width * scale, 240)}px`;
    return panel;
  }

  function currentMaps(item) {
    if (!state.compare) return [item.maps.find((map) => map.label === state.method) || item.maps[0]];
    return item.maps.filter((map) => !state.hidden.has(map.label));
  }

  function buildPanels(item) {
    const maps = currentMaps(item);
    const size = state.compare ? COMPARE_SIZE : SINGLE_SIZE;
    panels = maps.map((map) => buildPanel(item, map, size));
    const container = $("panels");
    container.className = state.compare ? "compare" : "single";
    container.replaceChildren(...panels.map((panel) => panel.node));
    if (!panels.length) container.append(element("p", {className: "status", textContent: "No method chosen to compare."}));
    clearPoint();
  }

  function buildPrediction(item) {
    const grid = item.grid ? `, patch grid ${item.grid[0]}×${item.grid[1]}` : "";
    const about = `${item.name} — ${item.width}×${item.height} px${grid}`;
    const nodes = [element("h2", {textContent: "Prediction"}), element("p", {className: "image-name", textContent: about})];
    if (item.target !== null) {
      const inTop = item.top5.some(([name]) => name === item.target);
      nodes.push(element("p", {className: "target"}, [
        "explained class: ", element("strong", {textContent: item.target}), inTop ? "" : " (not in the top 5)"]));
    }
    if (item.top5.length) {
      const predicted = element("strong", {textContent: item.top5[0][0]});
      nodes.push(element("p", {className: "predicted"}, ["predicted: ", predicted]));
      nodes.push(element("ol", {className: "top5"}, item.top5.map(([name, probability]) => {
        const fill = element("span", {className: "fill"});
        fill.style.width = `${100 * probability}%`;
        return element("li", {className: name === item.target ? "explained" : ""}, [
          element("span", {className: "name", textContent: name}),
          element("span", {className: "bar", title: `${(100 * probability).toFixed(2)} %`}, [fill]),
          element("span", {className: "probability", textContent: probability.toFixed(4)}),
        ]);
      })));
    } else {
      nodes.push(element("p", {className: "none", textContent: "no prediction given"}));
    }
    $("prediction").replaceChildren(...nodes);
  }

  function fillSelect(select, entries, selected) {
    select.replaceChildren(...entries.map(([value, label]) => element("option", {value, textContent: label})));
    select.value = selected;
  }

  /* The pickers show the current image's methods; the check boxes are made once per image, so a box
     toggled with the keyboard keeps the focus. */
  function syncControls(item) {
    $("image").value = String(state.item);
    for (const button of $("thumbnails").children) {
      button.setAttribute("aria-pressed", String(button.dataset.index === String(state.item)));
    }
    if (!item.maps.some((map) => map.label === state.method)) state.method = item.maps[0].label;
    fillSelect($("method"), item.maps.map((map) => [map.label, map.label]), state.method);
    $("method-picker").hidden = state.compare;
    $("compare").checked = state.compare;
    $("compare-methods").hidden = !state.compare;
    const boxes = $("compare-boxes");
    if (boxes.dataset.item !== String(state.item)) {
      boxes.dataset.item = String(state.item);
      boxes.replaceChildren(...item.maps.map((map) => {
        const box = element("input", {type: "checkbox", value: map.label});
        box.addEventListener("change", () => {
          if (box.checked) state.hidden.delete(map.label); else state.hidden.add(map.label);
          render();
        });
        return element("label", {}, [box, ` ${map.label}`]);
      }));
    }
    for (const box of boxes.querySelectorAll("input")) box.checked = !state.hidden.has(box.value);
  }

  /* Rebuild what changed, then draw every panel. */
  function render() {
    const item = DATA.items[state.item];
    const key = JSON.stringify([state.item, state.compare, state.compare ? [...state.hidden] : state.method]);
    if (key !== layout) {
      syncControls(item);
      buildPanels(item);
      buildPrediction(item);
      layout = key;
    }
    $("opacity-value").textContent = `${Math.round(100 * state.opacity)} %`;
    for (const panel of panels) draw(item, panel);
  }

  function step(list, current, by) {
    return list[(list.indexOf(current) + by + list.length) % list.length];
  }

  function onShortcut(event) {
    if (event.ctrlKey || event.metaKey || event.altKey || event.target.closest("input, select, textarea")) return;
    const item = DATA.items[state.item];
    const labels = item.maps.map((map) => map.label);
    const actions = {
      n: () => { state.item = (state.item + 1) % DATA.items.length; },
      p: () => { state.item = (state.item - 1 + DATA.items.length) % DATA.items.length; },
      "]": () => { state.method = step(labels, state.method, 1); },
      "[": () => { state.method = step(labels, state.method, -1); },
      c: () => { state.compare = !state.compare; },
    };
    if (!(event.key in actions)) return;
    event.preventDefault();
    actions[event.key]();
    render();
  }

  function setUp() {
    for (const kind of ["sequential", "diverging"]) {
      for (const entry of DATA.palettes[kind]) entry.colours = bytesOf(entry.rgb);
      fillSelect($(kind), DATA.palettes[kind].map((entry, i) => [String(i), entry.label]), "0");
      $(kind).addEventListener("change", () => { state[kind] = Number($(kind).value); render(); });
    }
    fillSelect($("image"), DATA.items.map((item, i) => [String(i), item.name]), "0");
    $("thumbnails").replaceChildren(...DATA.items.map((item, i) => {
      const button = element("button", {type: "button", title: item.name}, [
        element("img", {src: item.image, alt: ""}), element("span", {}, breakable(item.name))]);
      button.dataset.index = String(i);
      button.addEventListener("click", () => { state.item = i; render(); });
      return button;
    }));
    $("image").addEventListener("change", () => { state.item = Number($("image").value); render(); });
    $("method").addEventListener("change", () => { state.method = $("method").value; render(); });
    $("compare").addEventListener("change", () => { state.compare = $("compare").checked; render(); });
    $("compare-all").addEventListener("click", () => { state.hidden.clear(); render(); });
    $("compare-none").addEventListener("click", () => {
      for (const map of DATA.items[state.item].maps) state.hidden.add(map.label);
      render();
    });
    $("opacity").addEventListener("input", () => { state.opacity = Number($("opacity").value) / 100; render(); });
    $("interpolation").addEventListener("change", () => { state.interpolation = $("interpolation").value; render(); });
    $("controls").addEventListener("submit", (event) => event.preventDefault());
    document.addEventListener("keydown", onShortcut);
    state.opacity = Number($("opacity").value) / 100;
    state.interpolation = $("interpolation").value;
    state.method = DATA.items[0].maps[0].label;
  }

  async function main() {
    try {
      await Promise.all(DATA.items.flatMap((item) => [decodeImage(item), ...item.maps.map(decodeMap)]));
      setUp();
      $("status").hidden = true;
      $("explorer").hidden = false;
      render();
      document.documentElement.dataset.ready = "true";
    } catch (error) {
      $("status").textContent = `The explorer could not start: ${error}. It needs a current browser `
        + "(Chrome/Edge 80+, Firefox 113+, Safari 16.4+).";
      document.documentElement.dataset.ready = "error";
      throw error;
    }
  }

  main();
})();
