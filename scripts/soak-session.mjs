// The soak's checks in session mode (`npm run soak -- --session`, docs/session.md).
//
// A result's processId is its supervisor, whose output holds every command it ran, each
// between a begin and an end marker with the command's token: the result must be exactly one
// command's bytes (a timed-out one a prefix of one). Supervisors are alive between commands by
// design; the process list of the sandbox (the provider's view) says which: a call that ended
// abnormally (an error, a timeout, `containment: 'provider'`) must leave no supervisor alive
// that was not idle before it, and one fewer when it took an idle one.

import { readFileSync } from 'node:fs'

const BEGIN = /\0\x1ecos-begin:([0-9a-f]{32})\n/g
const END = /\0\x1ecos-end:([0-9a-f]{32}):(\d+):([01])\n/

/** token → { stdout, stderr, ended } of every command in a supervisor's output record. */
export function segments(rec) {
  const out = new Map()
  for (const stream of ['stdout', 'stderr']) {
    const text = Buffer.from(rec[stream] || []).toString('latin1')
    const starts = [...text.matchAll(BEGIN)]
    starts.forEach((m, i) => {
      const from = m.index + m[0].length
      const to = i + 1 < starts.length ? starts[i + 1].index : text.length
      let body = text.slice(from, to)
      const end = body.match(END)
      const ended = Boolean(end && end[1] === m[1])
      if (end) body = body.slice(0, end.index)
      const seg = out.get(m[1]) || { stdout: '', stderr: '', ended: true }
      seg[stream] = Buffer.from(body, 'latin1').toString('utf8')
      seg.ended = seg.ended && ended
      out.set(m[1], seg)
    })
  }
  return [...out.values()]
}

/** Checks a session result's output against its supervisor's record; returns problems. */
export function checkOutput(rec, res) {
  const segs = segments(rec)
  const meta = res.metadata || {}
  if (!['supervisor', 'provider'].includes(meta.containment)) return [`metadata.containment is ${meta.containment}`]
  const fits = (seg) => ['stdout', 'stderr'].every((s) => {
    const got = res[s]
    if (meta.outputTruncated) return seg[s].endsWith(got.replace(/^\uFFFD/, ''))
    if (res.timedOut) return seg[s].startsWith(got.replace(/\uFFFD$/, ''))
    return got === seg[s]
  })
  if (!segs.some((seg) => (res.timedOut || seg.ended) && fits(seg))) {
    return [`output matches no command of supervisor ${meta.processId} (${segs.length} commands)`]
  }
  return []
}

/** The live supervisors of a sandbox, by the provider's process list. */
export async function supervisorsOf(emu, sb) {
  const r = await fetch(`${emu.url}/v1/sandboxes/${sb}/processes?limit=500`, { headers: { 'X-Api-Key': emu.apiKey } })
  if (!r.ok) return null
  const body = await r.json()
  const list = (body.data && body.data.processes) || []
  return new Set(list
    .filter((p) => p.tree_exited !== true && (p.args || []).some((a) => typeof a === 'string' && a.includes('__cos_marker=')))
    .map((p) => p.process_id))
}

/**
 * After one call on a sandbox that ended abnormally (an error, a timeout, `containment:
 * 'provider'`): no supervisor alive that was not idle before it; the one a result names is
 * gone; every supervisor the call sent an input to got a DELETE (the proof) afterwards.
 */
export function checkProof(before, after, res, requests) {
  if (!before || !after) return ['process list unreadable']
  const v = []
  for (const id of after) if (!before.has(id)) v.push(`supervisor ${id} of an abnormal end is alive`)
  const named = res && res.metadata && res.metadata.processId
  if (named && after.has(named)) v.push(`supervisor ${named} of an abnormal end is alive`)
  for (const [i, r] of requests.entries()) {
    const m = r.method === 'POST' && r.path.match(/\/processes\/([^/]+)\/input$/)
    if (!m) continue
    const proven = requests.slice(i + 1).some((d) => d.method === 'DELETE' && d.path.endsWith(`/processes/${m[1]}`))
    if (!proven) v.push(`no DELETE of supervisor ${m[1]} after its input`)
  }
  return v
}

/** Live pids of session supervisors (by command line). */
export function supervisorPids(pids) {
  return pids.filter((pid) => {
    try {
      return readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes('__cos_marker=')
    } catch {
      return false
    }
  })
}
