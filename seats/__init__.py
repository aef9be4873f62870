"""seats: seat state, mailboxes, inbox dispatch, completion ledger, holds, pauses, turn runner seam, retirement."""
