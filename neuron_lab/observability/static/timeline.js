// neuron_lab's interactive timeline: a self-contained canvas widget (no library, no network),
// so that it works offline in JupyterLab, in the classic notebook and in a notebook saved as HTML.
//
//   neuronTimeline(element, data)
//
// data: {title, end, lanes: [{name, kind}], bars: [[lane, start, duration, colour, tip]],
//        series: [{lane, points: [[t, value], ...], unit}], legend: [[label, colour]]}
// Times are microseconds from the profile's start. Wheel or +/- zooms around the pointer,
// dragging pans, double click (or "reset") shows everything; hovering a bar shows its tip.
// The element's dataset carries the visible window (viewStart, viewEnd) and the hovered
// bar's index (hover) for tests; element.neuronTimeline has barCenter(i),
// barTime(i), isOp(i), zoom(f), setView(a, b).
(function () {
  "use strict";
  var LANE_H = 22, LABEL_W = 150, AXIS_H = 22, PAD = 6, MEM_H = 44;

  function fmt(us) {
    var a = Math.abs(us);
    if (a >= 1e6) return (us / 1e6).toFixed(2) + " s";
    if (a >= 1e3) return (us / 1e3).toFixed(a >= 1e5 ? 0 : 2) + " ms";
    return us.toFixed(a >= 100 ? 0 : 1) + " µs";
  }

  function fmtBytes(b) {
    var u = ["B", "KiB", "MiB", "GiB"], i = 0;
    while (Math.abs(b) >= 1024 && i < u.length - 1) { b /= 1024; i++; }
    return b.toFixed(i ? 1 : 0) + " " + u[i];
  }

  function render(root, data) {
    root.innerHTML = "";
    root.style.fontFamily = "sans-serif";
    root.style.fontSize = "12px";
    root.style.position = "relative";
    var bar = document.createElement("div");
    bar.style.margin = "2px 0 4px 0";
    var title = document.createElement("b");
    title.textContent = data.title || "neuron timeline";
    bar.appendChild(title);
    function button(label, help, onclick) {
      var b = document.createElement("button");
      b.textContent = label;
      b.title = help;
      b.style.marginLeft = "6px";
      b.onclick = onclick;
      bar.appendChild(b);
      return b;
    }
    root.appendChild(bar);
    var canvas = document.createElement("canvas");
    canvas.style.display = "block";
    canvas.style.width = "100%";
    canvas.style.cursor = "grab";
    canvas.setAttribute("role", "img");
    canvas.setAttribute("aria-label", (data.title || "timeline") + ": scroll to zoom, drag to pan");
    root.appendChild(canvas);
    var tip = document.createElement("div");
    tip.className = "neuron-timeline-tip";
    tip.style.cssText = "position:absolute;display:none;pointer-events:none;background:#fff;border:1px solid #888;" +
      "padding:4px 6px;white-space:pre;max-width:560px;overflow:hidden;box-shadow:1px 1px 4px rgba(0,0,0,.25);z-index:10";
    root.appendChild(tip);
    var legend = document.createElement("div");
    legend.style.marginTop = "3px";
    (data.legend || []).forEach(function (l) {
      var s = document.createElement("span");
      s.style.marginRight = "12px";
      s.innerHTML = "<span style='display:inline-block;width:10px;height:10px;margin-right:3px;background:" +
        l[1] + "'></span>";
      s.appendChild(document.createTextNode(l[0]));
      legend.appendChild(s);
    });
    root.appendChild(legend);

    var lanes = data.lanes, bars = data.bars, series = data.series || [];
    var laneTop = [], y = AXIS_H;
    lanes.forEach(function (lane) {
      laneTop.push(y);
      y += lane.kind === "memory" ? MEM_H : LANE_H;
    });
    var height = y + PAD;
    var end = Math.max(data.end || 0, 1e-3);
    bars.forEach(function (b) { end = Math.max(end, b[1] + b[2]); });
    var view = [0, end], width = 0, hover = -1;

    function plotWidth() { return Math.max(width - LABEL_W - PAD, 10); }
    function x(t) { return LABEL_W + (t - view[0]) / (view[1] - view[0]) * plotWidth(); }
    function t(px) { return view[0] + (px - LABEL_W) / plotWidth() * (view[1] - view[0]); }
    function laneHeight(i) { return lanes[i].kind === "memory" ? MEM_H : LANE_H; }

    function barBox(i) {
      var b = bars[i], inner = b[5] ? 3 : 0;
      var x0 = x(b[1]), x1 = x(b[1] + b[2]);
      return {x: x0, w: Math.max(x1 - x0, 1), y: laneTop[b[0]] + 3 + inner, h: LANE_H - 6 - 2 * inner};
    }

    function draw() {
      var ratio = window.devicePixelRatio || 1;
      width = canvas.clientWidth || 900;
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
      canvas.style.height = height + "px";
      var g = canvas.getContext("2d");
      g.setTransform(ratio, 0, 0, ratio, 0, 0);
      g.clearRect(0, 0, width, height);
      g.font = "11px sans-serif";
      g.textBaseline = "middle";
      // lanes
      lanes.forEach(function (lane, i) {
        g.fillStyle = i % 2 ? "#fafafa" : "#f0f0f0";
        g.fillRect(0, laneTop[i], width, laneHeight(i));
        g.fillStyle = "#222";
        g.fillText(lane.name, 4, laneTop[i] + laneHeight(i) / 2, LABEL_W - 8);
      });
      // time axis
      var span = view[1] - view[0], step = Math.pow(10, Math.floor(Math.log10(span / 6)));
      if (span / step > 12) step *= 2;
      if (span / step > 12) step *= 2.5;
      g.strokeStyle = "#ddd";
      g.fillStyle = "#444";
      for (var tick = Math.ceil(view[0] / step) * step; tick <= view[1]; tick += step) {
        var px = x(tick);
        g.beginPath(); g.moveTo(px, AXIS_H - 4); g.lineTo(px, height - PAD); g.stroke();
        g.fillText(fmt(tick), px + 2, AXIS_H / 2);
      }
      // bars, clipped to the plot
      g.save();
      g.beginPath(); g.rect(LABEL_W, 0, plotWidth(), height); g.clip();
      for (var i = 0; i < bars.length; i++) {
        var b = bars[i];
        if (b[1] > view[1] || b[1] + b[2] < view[0]) continue;
        var box = barBox(i);
        g.fillStyle = b[3];
        g.fillRect(box.x, box.y, box.w, box.h);
        if (i === hover) {
          g.strokeStyle = "#000"; g.lineWidth = 1.5; g.strokeRect(box.x, box.y, box.w, box.h); g.lineWidth = 1;
        }
        if (box.w > 40 && b[6]) {
          g.fillStyle = "#fff";
          g.fillText(b[6], box.x + 3, box.y + box.h / 2, box.w - 6);
        }
      }
      // memory: a step line per lane, scaled to its peak
      series.forEach(function (s) {
        var top = laneTop[s.lane] + 4, h = MEM_H - 8, peak = 1;
        s.points.forEach(function (p) { peak = Math.max(peak, p[1]); });
        g.strokeStyle = s.colour || "#4c72b0";
        g.beginPath();
        var last = null;
        s.points.forEach(function (p) {
          var px = x(p[0]), py = top + h - p[1] / peak * h;
          if (last === null) g.moveTo(px, py); else { g.lineTo(px, last); g.lineTo(px, py); }
          last = py;
        });
        if (last !== null) g.lineTo(x(view[1]), last);
        g.stroke();
        g.fillStyle = "#444";
        g.fillText("peak " + fmtBytes(peak), LABEL_W + 4, top + 6);
      });
      g.restore();
      root.dataset.viewStart = view[0];
      root.dataset.viewEnd = view[1];
      root.dataset.hover = hover;
    }

    function setView(a, b) {
      var min = end * 1e-7 + 1e-3;
      if (b - a < min) { var c = (a + b) / 2; a = c - min / 2; b = c + min / 2; }
      var margin = end * 0.05;
      if (a < -margin) { b += -margin - a; a = -margin; }
      if (b > end + margin) { a -= b - end - margin; b = end + margin; }
      view = [Math.max(a, -margin), b];
      draw();
    }

    function zoom(factor, around) {
      var c = around === undefined ? (view[0] + view[1]) / 2 : around;
      setView(c - (c - view[0]) * factor, c + (view[1] - c) * factor);
    }

    function pick(px, py) {
      var best = -1, bestW = Infinity;
      for (var i = 0; i < bars.length; i++) {
        var box = barBox(i);
        if (px >= box.x - 1 && px <= box.x + box.w + 1 && py >= box.y && py <= box.y + box.h && box.w < bestW) {
          best = i; bestW = box.w;
        }
      }
      return best;
    }

    function memoryAt(px, py) {
      for (var k = 0; k < series.length; k++) {
        var s = series[k], top = laneTop[s.lane];
        if (py < top || py > top + MEM_H) continue;
        var at = t(px), value = null;
        s.points.forEach(function (p) { if (p[0] <= at) value = p[1]; });
        if (value !== null) return lanes[s.lane].name + " at " + fmt(at) + ": " + fmtBytes(value);
      }
      return null;
    }

    function showTip(text, ev) {
      if (!text) { tip.style.display = "none"; return; }
      tip.textContent = text;
      tip.style.display = "block";
      var r = root.getBoundingClientRect();
      var left = ev.clientX - r.left + 14;
      if (left + tip.offsetWidth > r.width) left = Math.max(0, ev.clientX - r.left - tip.offsetWidth - 14);
      tip.style.left = left + "px";
      // Inside the widget (notebook outputs clip what hangs out): below the pointer, else above it.
      var top = ev.clientY - r.top + 14;
      if (top + tip.offsetHeight > r.height) top = Math.max(0, ev.clientY - r.top - tip.offsetHeight - 10);
      tip.style.top = top + "px";
    }

    var dragging = null;
    canvas.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      var r = canvas.getBoundingClientRect();
      zoom(ev.deltaY < 0 ? 0.8 : 1.25, t(ev.clientX - r.left));
    }, {passive: false});
    canvas.addEventListener("mousedown", function (ev) {
      dragging = {x: ev.clientX, view: view.slice()};
      canvas.style.cursor = "grabbing";
    });
    window.addEventListener("mouseup", function () { dragging = null; canvas.style.cursor = "grab"; });
    canvas.addEventListener("mousemove", function (ev) {
      var r = canvas.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
      if (dragging) {
        var dt = (ev.clientX - dragging.x) / plotWidth() * (dragging.view[1] - dragging.view[0]);
        setView(dragging.view[0] - dt, dragging.view[1] - dt);
        return;
      }
      var found = pick(px, py);
      if (found !== hover) { hover = found; draw(); }
      showTip(found >= 0 ? bars[found][4] : memoryAt(px, py), ev);
    });
    canvas.addEventListener("mouseleave", function () {
      tip.style.display = "none";
      if (hover !== -1) { hover = -1; draw(); }
    });
    canvas.addEventListener("dblclick", function () { setView(0, end); });
    button("+", "zoom in", function () { zoom(0.5); });
    button("\u2212", "zoom out", function () { zoom(2); });
    button("reset", "show the whole profile", function () { setView(0, end); });
    var hint = document.createElement("span");
    hint.style.cssText = "margin-left:10px;color:#666";
    hint.textContent = "scroll to zoom, drag to pan, hover for details";
    bar.appendChild(hint);

    root.neuronTimeline = {
      zoom: zoom,
      setView: setView,
      barCenter: function (i) {
        var box = barBox(i), r = canvas.getBoundingClientRect();
        return {x: r.left + box.x + box.w / 2, y: r.top + box.y + box.h / 2};
      },
      isOp: function (i) { return !!bars[i][5]; },
      barTime: function (i) { return [bars[i][1], bars[i][2]]; },
      bars: bars.length
    };
    if (window.ResizeObserver) new ResizeObserver(function () { draw(); }).observe(canvas);
    draw();
  }

  window.neuronTimeline = render;
})();
