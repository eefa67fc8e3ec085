// Small statistics and formatting helpers for the bench table.

export function stats(values) {
  const v = values.filter((x) => typeof x === 'number' && Number.isFinite(x)).sort((a, b) => a - b)
  if (v.length === 0) return { median: null, min: null, max: null, n: 0, values: [] }
  const mid = v.length >> 1
  const median = v.length % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2
  return { median, min: v[0], max: v[v.length - 1], n: v.length, values: values.slice() }
}

export function fmt(x, digits) {
  if (x === null || x === undefined || Number.isNaN(x)) return 'n/a'
  if (typeof x !== 'number') return String(x)
  const d = digits ?? (Math.abs(x) >= 100 ? 0 : Math.abs(x) >= 10 ? 1 : 2)
  return x.toFixed(d)
}

/** Renders rows ({ section, metric, median, min, max, n, unit, note }) as a fixed-width table. */
export function renderTable(rows) {
  const head = ['§', 'metric', 'median', 'min', 'max', 'n', 'unit', 'note']
  const body = rows.map((r) => [
    r.section,
    r.metric,
    fmt(r.median, r.digits),
    fmt(r.min, r.digits),
    fmt(r.max, r.digits),
    r.n === undefined ? '' : String(r.n),
    r.unit || '',
    r.note || '',
  ])
  const widths = head.map((h, i) => Math.max(h.length, ...body.map((b) => b[i].length)))
  const right = new Set([2, 3, 4, 5])
  const line = (cells) => cells
    .map((c, i) => (i === cells.length - 1 ? c : right.has(i) ? c.padStart(widths[i]) : c.padEnd(widths[i])))
    .join('  ')
    .trimEnd()
  const sep = widths.map((w, i) => (i === widths.length - 1 ? '-'.repeat(Math.min(w, 40)) : '-'.repeat(w))).join('  ')
  return [line(head), sep, ...body.map(line)].join('\n')
}
