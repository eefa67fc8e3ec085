'use strict'

// diagnostics_channel: `createos-execute:request` (one message per HTTP attempt) and
// `createos-execute:cleanup` (one per cleanup step). Fixed words and numbers only.

const diagnostics = require('node:diagnostics_channel')

const channels = {
  request: diagnostics.channel('createos-execute:request'),
  cleanup: diagnostics.channel('createos-execute:cleanup'),
}

// Checked once per call: with no subscriber, native gets no callback and builds no events.
function diagnosticsCallback() {
  if (!channels.request.hasSubscribers && !channels.cleanup.hasSubscribers) return undefined
  return (name, event) => {
    const channel = channels[name]
    if (channel === undefined || !channel.hasSubscribers) return
    try {
      channel.publish(event)
    } catch {
      // A throwing subscriber is the subscriber's problem (node reports it); the call goes on.
    }
  }
}

// The events of work no call owns (a session supervisor's stream and its end): published as a
// call's are, when somebody subscribes at that moment.
function publishBackground(name, event) {
  const channel = channels[name]
  if (channel === undefined || !channel.hasSubscribers) return
  try {
    channel.publish(event)
  } catch {
    // As above.
  }
}

module.exports = { channels, diagnosticsCallback, publishBackground }
