/**
 * What a storage failure means to a session: a hello closes (as a handshake timeout once
 * `hello_timeout` has passed); a register or unregister is answered 500; reads, deletes, month
 * moves and the steps of the end are retried with backoff, the end until `saveRetryForMs`.
 */
import { ended } from "./closing.ts"
import type { CommandResult } from "./inputs.ts"
import { backoff, closeEarly, NOTHING, type Out, withSession } from "./out.ts"
import type { Closing, Live, Phase, Retry, Unidentified } from "./phases.ts"
import { refuse } from "./refusal.ts"

type Failed = Extract<CommandResult, { _tag: "CommandFailed" }>

/** A hello's storage failed (or did not answer within `storage_timeout`): close — as a handshake timeout once `hello_timeout` has passed. */
export const helloFailed = (phase: Unidentified, _input: Failed, out: Out): Phase =>
  closeEarly(out.now >= phase.openedAt + out.options.helloTimeoutMs ? "hello-timeout" : "storage-error", out)

/** A live session's storage failed: a register or unregister is answered 500; the rest is retried with backoff. */
export const liveCommandFailed = (phase: Live, { command }: Failed, out: Out): Phase => {
  switch (command._tag) {
    case "MintUaid":
    case "ReadUser":
    case "SaveMessages":
    case "ClearNodeId":
    case "TakeMessage":
      throw new Error(`${command._tag} failed in phase ${phase._tag}`)
    case "WriteUser":
      if (command.purpose._tag === "Resume") throw new Error(`a resume write failed in phase ${phase._tag}`)
      refuse(out, phase.session.uaid, { messageType: "register", channelID: command.purpose.registering.channelId }, "not-written")
      return phase
    case "MakeEndpoint":
      refuse(out, phase.session.uaid, { messageType: "register", channelID: command.channelId }, "not-written")
      return phase
    case "AddChannel":
      refuse(out, phase.session.uaid, { messageType: "register", channelID: command.registering.channelId }, "not-written")
      return phase
    case "RemoveChannel":
      refuse(out, phase.session.uaid, { messageType: "unregister", channelID: command.channelId }, "not-written")
      return phase
    case "WriteUrgency":
      refuse(out, phase.session.uaid, { messageType: "urgency" }, "not-written")
      return phase
    default: {
      const retry: Retry = { command: { ...command, attempt: command.attempt + 1 }, at: out.now + backoff(out.options, command.attempt) }
      return withSession(phase, { ...phase.session, retry })
    }
  }
}

/** A step of the end failed: retried with backoff until `saveRetryForMs`; then the session ends without what was left. */
export const closingFailed = (phase: Closing, { command }: Failed, out: Out): Phase => {
  switch (command._tag) {
    case "ReadUser":
    case "ReadPage":
    case "SaveMessages":
    case "ClearNodeId":
    case "TombstoneAcked":
    case "TakeMessage": {
      if (out.now - phase.since >= out.options.saveRetryForMs) return ended(phase, NOTHING, out)
      return { ...phase, retry: { command: { ...command, attempt: command.attempt + 1 }, at: out.now + backoff(out.options, command.attempt) } }
    }
    default:
      throw new Error(`${command._tag} failed in phase Closing`)
  }
}
