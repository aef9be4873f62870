"""seats: seat state, mailboxes, inbox dispatch and its digest coalescer, completion ledger, holds, pauses, turn runner seam, retirement."""
