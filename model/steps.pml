/*
 * django-idempotency: a request in steps (docs/steps.md) as a Promela model, checked by Spin
 * (make model), beside the claim protocol's (protocol.pml).
 *
 * One key; NREQ requests for it (the client's first attempt and its retries, or duplicates)
 * and, with COMPLETER, the completer, race against a clock, crashes (a worker SIGKILLed at any
 * point: before a step, inside the remote step before and after the provider's call, after
 * the last step) and errors of the view (the key given back). The view runs the example's
 * charge in four steps: create_charge (local), call_provider (remote: the payment provider,
 * which charges once per downstream key and answers a key it has seen with its first answer),
 * record_answer (local, which records the provider's answer with its own commit),
 * send_receipt (local); then the completion. The assertions:
 *
 *   (s1) each local step takes effect at most once                       STEP_COMMITS()
 *   (s2) in order: a step commits only on the recovery point of the      STEP_COMMITS()
 *        step before it (none skipped, none done twice)
 *   (s3) the completion commits once, and only with every step done      COMPLETES()
 *        (the provider's charge recorded)
 *   (s4) the steps of a key are one request's: no request with other     STEP_COMMITS()
 *        content runs a step of a key that has steps of another's
 *   (s5) a charge made at the provider is never left without its local   Orphan
 *        record: from the provider's call on, the key's row holds the
 *        charge's step, for a retry or the completer to resume
 *   (s6) with LIFETIME, the provider forgets a downstream key LIFETIME    PROVIDER_CALL
 *        ticks after its first use (and would charge it again): it
 *        charges once (DOWNSTREAM_KEY_LIFETIME)
 *
 * Every step names the code it stands for in a comment, as protocol.pml's do:
 * tests/system/test_model.py checks that each name exists.
 *
 * With LIFETIME, a remote step an earlier attempt marked as called is called again only while
 * the key's first claim (created_at, kept by the takeover of a key in steps) is younger than
 * LIFETIME ticks; else the request is refused (409 remote-outcome-unknown) and the key given
 * back. BUG_FORGOTTEN (no such check) and BUG_CREATED_RESET (the takeover stamps created_at
 * anew) model code that would be wrong.
 *
 * With PURGE, keys expire (TTL ticks after their claim, takeover or completion) and the purge
 * removes one whose TTL is over unless it is in progress under a live lease or with steps
 * (a recovery point, the completer's request, a remote call's mark); (s5) holds until a
 * completed key is purged, and a client's retry after that is a new request, not modelled.
 * BUG_PURGE_STEPS models the purge before, which removed a key in progress with steps once
 * its TTL was over and its lease had lapsed: a charge left without its record.
 *
 * Time is the database's clock (now), in ticks. BUG_NOFENCE (a step recorded without the
 * claim token), BUG_READ_FIRST (the steps read before the takeover), BUG_DELETE (a claim
 * given back deletes its row whatever its steps), BUG_RESUME_GONE (the completer's request
 * claims a purged key afresh) and BUG_EXPIRED_FRESH (advisory_lock takes a row whose TTL is
 * over without its steps) model code that would be wrong, and the model finds each one's
 * counterexample (model/configurations).
 */

#ifndef NREQ
#define NREQ 2
#endif
#define DB 1
#define ADV 2
#ifndef STRATEGY
#define STRATEGY DB
#endif
#ifndef COMPLETER
#define COMPLETER 1
#endif
#ifndef ATTEMPTS
#define ATTEMPTS 2  /* COMPLETER_ATTEMPTS */
#endif
#ifndef CRASHES
#define CRASHES 2
#endif
#ifndef ERRORS
#define ERRORS 1
#endif
#define LOCK 1      /* LOCK_TIMEOUT, in ticks */
#ifndef TTL
#define TTL 2       /* TTL, in ticks (with PURGE) */
#endif
#define AFTER 1     /* COMPLETER_AFTER, in ticks past the lapsed lease */
#ifndef PAUSE
#define PAUSE 1     /* a live owner's heartbeat may stall this many ticks past its lease */
#endif
#ifndef MAXT
#define MAXT 5
#endif

/* The actors: requests 1..NREQ, the completer NREQ + 1. The last request carries other
 * content (another fingerprint) when OTHER is defined. */
#define CID (NREQ + 1)
#define NACT (NREQ + COMPLETER)
#define HANDED (NACT + 1)  /* the token of a claim given back: held by no one */

#define NONE 0
#define INPROG 1
#define DONE 2

/* The steps, by position: the recovery point is how many are recorded. */
#define NSTEPS 4
#define REMOTE 1    /* call_provider */

/* What a claim found. */
#define O_CLAIM 1
#define O_REPLAY 2
#define O_BUSY 3
#define O_MISMATCH 4
#define O_LOST 5

typedef KeyRow {  /* the key's row of IdempotencyKey */
    byte st; byte tok; byte locked; byte fp;  /* fp: the fingerprint column */
    byte rp; byte sfp;                        /* recovery_point, and steps' fingerprint */
    bool kept;                                /* steps["request"]: the completer's */
    byte exp;                                 /* expires_at (with PURGE) */
    byte created;                             /* created_at: the first claim (LIFETIME) */
    bool calling                              /* steps["calling"]: a remote call marked */
}

KeyRow kt;
byte lk;              /* advisory_lock: the session lock's holder, 0 when free */
byte now;
byte crashes = CRASHES;
byte errors = ERRORS;
byte finished;
byte eff[NSTEPS];     /* the committed effects of each local step */
bool charged;         /* the provider charged the downstream key */
byte charges;         /* how many times it charged (LIFETIME) */
byte first_use;       /* when it first saw the downstream key (LIFETIME) */
byte completions;
bool purged;          /* the purge removed the key's row */
bool expired_done;    /* ... a completed one */
/* own[id]: 1 + the time of the last renewal of id's lease while it owns a claim (db). */
byte own[NACT + 1];

/* (s1), (s2), (s4): a local step's commit, with the row as the step's transaction finds it
 * under its fencing (see STEP_RECORD). */
#define STEP_COMMITS(i, fp, pending) \
    assert(kt.rp == i || (pending && kt.rp == i - 1)); \
    assert(kt.rp == 0 || kt.sfp == fp); \
    eff[i]++; assert(eff[i] == 1)
/* (s3) */
#define COMPLETES() \
    assert(kt.rp == NSTEPS && eff[0] == 1 && eff[2] == 1 && eff[3] == 1 && charged); \
    completions++; assert(completions == 1)

/* Whether a request claims a key the purge removed: a client's retry would be a new request
 * (not modelled); the completer's request sent again finds nothing to resume and is given
 * back unclaimed (code: protocol.resend.check_resumed). BUG_RESUME_GONE models the code
 * before, which claimed it afresh and ran the steps again from the first. */
#ifdef BUG_RESUME_GONE
#define RESUME_GONE(completer) completer
#else
#define RESUME_GONE(completer) false
#endif
/* PURGED: the request ends without a claim (a client: a new request; the completer: the
 * run counts as taken). */

#ifdef LIFETIME
/* (s6): the provider's call with the downstream key, one at a time per key (a concurrent one
 * with the same key is refused, as Stripe's are): a key it has seen within LIFETIME ticks
 * is answered with the first charge; one it has forgotten is charged again. */
#define PROVIDER_CALL \
    atomic { \
        if \
        :: !charged -> charged = true; charges++; first_use = now \
        :: charged && first_use + LIFETIME <= now -> charges++ \
        :: else -> skip \
        fi; \
        assert(charges <= 1) \
    }
/* The first claim's time: the takeover of a key with steps (a recovery point, the completer's
 * request or a remote call's mark) keeps it; any other claim stamps it. */
#ifdef BUG_CREATED_RESET
#define FIRST_CLAIM kt.created = now
#else
#define FIRST_CLAIM if :: kt.rp == 0 && !kt.kept && !kt.calling -> kt.created = now :: else fi
#endif
#define STAMP(at) kt.created = at
#define CLAIMED_AT(at) claimed = at
#else
#define PROVIDER_CALL charged = true
#define FIRST_CLAIM skip
#define STAMP(at) skip
#define CLAIMED_AT(at) skip
#endif

#define CRASH_POINT if :: crashes > 0 -> crashes--; goto crashed :: true fi
#define ERROR_POINT if :: errors > 0 -> errors--; goto failed :: true fi

#define LAPSED(i) (own[i] != 0 && own[i] - 1 + LOCK + PAUSE <= now)
#if NACT > 3
#define OWNERS_LIVE (!LAPSED(1) && !LAPSED(2) && !LAPSED(3) && !LAPSED(4))
#elif NACT > 2
#define OWNERS_LIVE (!LAPSED(1) && !LAPSED(2) && !LAPSED(3))
#else
#define OWNERS_LIVE (!LAPSED(1) && !LAPSED(2))
#endif

proctype Clock() {
end:
    do
    :: atomic { now < MAXT && OWNERS_LIVE -> now++ }
    :: now == MAXT -> break
    od
}

/* The heartbeat (db, and advisory_lock's claim beside its session lock): code:
 * protocol.lease.LeaseKeeper._renew, strategies.db.DatabaseClaim.renew,
 * store.sql.owner.renew (fenced by the token) */
#define RENEW(id) do \
    :: atomic { kt.st == INPROG && kt.tok == id && kt.locked < now -> kt.locked = now; own[id] = now + 1 } \
    :: break \
    od

/* (s5), at every state. */
active proctype Orphan() {
end:
    atomic { charged && !expired_done && !(kt.st == DONE || (kt.st == INPROG && kt.rp >= 1)) -> assert(false) }
}

#ifdef PURGE
/* The purge (the command, the task, the admin's action, a partition's drop): a key whose TTL
 * is over, unless it is in progress under a live lease, or with steps, whatever its lease.
 * After it, a client's retry is a new request (outside the model: the clients here do not
 * come back); the completer may still be running a key it picked before.
 * code: store.purge.PurgeQuerySet.iter_delete_expired, store.purge.PurgeQuerySet.purgeable,
 * store.sql.purge.purgeable, store.partitions.drop */
#ifdef BUG_PURGE_STEPS
#define UNFINISHED false
#else
#define UNFINISHED (kt.st == INPROG && (kt.rp > 0 || kt.kept || kt.calling))
#endif
active proctype Purge() {
end:
    atomic {
        kt.st != NONE && kt.exp <= now && !(kt.st == INPROG && kt.locked + LOCK > now) &&
        !UNFINISHED ->
        expired_done = (kt.st == DONE);
        kt.st = NONE; kt.tok = 0; kt.fp = 0; kt.rp = 0; kt.sfp = 0; kt.kept = false;
        kt.calling = false; purged = true
    }
}
#define LIVE (kt.exp > now)
#define EXPIRES kt.exp = now + TTL
#else
#define LIVE true
#define EXPIRES skip
#endif

proctype Request(byte id; byte fp; bool completer) {
    byte res, got, i, attempts, claimed;
    bool pending, fresh, called;

again:
    if
    :: completer ->
        /* The completer: a key in progress, its request kept, its lease lapsed AFTER ago,
         * counted on its row while the row is as it was read (the token, still lapsed).
         * code: completer.due_keys, completer.complete, completer._mark */
end_due:
        atomic {
            attempts < ATTEMPTS && kt.st == INPROG && kt.kept && kt.locked + LOCK + AFTER <= now ->
            attempts++; fp = kt.sfp  /* the kept request: its content, its fingerprint */
        }
    :: else
    fi;

#ifdef BUG_READ_FIRST
    got = kt.rp;  /* the steps read before the claim: stale by the time it is taken */
#endif

#if STRATEGY == DB
    /* The claim: the INSERT, or the takeover of a stale claim (keeping its steps and
     * recovery point), re-checked on the row in one statement.
     * code: strategies.stepped.SteppedDatabaseStrategy.claim, strategies.db.DatabaseStrategy.claim,
     * store.sql.claim.claim, store.sql.claim.take_over */
    atomic {
        if
        :: kt.st == NONE && (!purged || RESUME_GONE(completer)) ->
            kt.st = INPROG; kt.tok = id; kt.locked = now; kt.fp = fp; kt.rp = 0; kt.sfp = 0;
            kt.kept = false; kt.calling = false; STAMP(now); res = O_CLAIM;
            own[id] = now + 1; EXPIRES
        :: kt.st == NONE && purged && !RESUME_GONE(completer) -> res = O_BUSY  /* PURGED */
        /* A stale claim is free for a request with its content, or when it committed no
         * steps; else answered as the row says. code: store.sql.schema.Schema.claimable,
         * store.sql.read.claim_read */
        :: kt.st == INPROG && kt.locked + LOCK <= now && ((kt.rp == 0 && !kt.kept && !kt.calling) || kt.fp == fp) ->
            FIRST_CLAIM; kt.tok = id; kt.locked = now; kt.fp = fp; res = O_CLAIM;
            own[id] = now + 1; EXPIRES
        :: kt.st == INPROG && kt.locked + LOCK <= now && !((kt.rp == 0 && !kt.kept && !kt.calling) || kt.fp == fp) ->
            res = O_MISMATCH
        :: kt.st == INPROG && kt.locked + LOCK > now -> res = O_BUSY
        :: kt.st == DONE && kt.fp == fp -> res = O_REPLAY
        :: kt.st == DONE && kt.fp != fp -> res = O_MISMATCH
        fi
    }
    if
    :: res != O_CLAIM -> goto answered
    :: else
    fi;
    /* The steps the row holds, read after the claim (an owner that was taken over can no
     * longer record one: STEP_RECORD), and handed back as found to a request with other
     * content. code: strategies.stepped.load_state, strategies.stepped.StepClaim.found,
     * strategies.stepped.StepClaim.hand_back */
    atomic {
#ifndef BUG_READ_FIRST
        got = kt.rp;
#endif
        called = kt.calling;
        if
        :: kt.rp > 0 && kt.sfp != fp -> res = O_MISMATCH
        :: else
        fi
    }
    if
    :: res == O_MISMATCH ->
        atomic {
            if
            :: kt.tok == id && kt.st == INPROG -> kt.tok = HANDED; kt.locked = 0; kt.fp = kt.sfp
            :: else
            fi;
            own[id] = 0
        };
        goto answered
    :: else
    fi;
#else
    /* advisory_lock: the key's lock (a 409 when the wait ends), then under it: the row
     * read; a new claim, or the takeover of a row whose owner is gone (its session lock
     * with it), or the row's answer. The session lock is held until the last commit. The
     * claim is made in the view's transaction: a new row is durable with the first step's
     * commit (fresh until then), and gone with a crash or an error before it.
     * code: strategies.stepped.SteppedAdvisoryStrategy.claim,
     * strategies.stepped.SteppedAdvisoryStrategy._claim_locked, strategies.advisory.lock */
    if
    :: atomic { lk == 0 -> lk = id }
    :: res = O_BUSY; goto answered
    fi;
    atomic {
        if
        :: kt.st == DONE && kt.fp == fp -> res = O_REPLAY; lk = 0
        :: kt.st == DONE && kt.fp != fp -> res = O_MISMATCH; lk = 0
        :: kt.st != DONE && kt.st != NONE && kt.fp != fp && LIVE -> res = O_MISMATCH; lk = 0
        :: kt.st == NONE && (!purged || RESUME_GONE(completer)) ->
            fresh = true; res = O_CLAIM; got = 0; called = false; CLAIMED_AT(now)
        :: kt.st == NONE && purged && !RESUME_GONE(completer) -> res = O_BUSY; lk = 0  /* PURGED */
#ifdef PURGE
        /* A row whose TTL is over reads as absent: the claim takes it over when its lease
         * has lapsed (its steps with it), and the steps it holds are loaded then (a 409
         * while its lease looks live). BUG_EXPIRED_FRESH models the code before, which
         * did not load them. code: strategies.stepped.resumed */
        :: kt.st == INPROG && !LIVE && kt.locked + LOCK > now -> res = O_BUSY; lk = 0
        :: kt.st == INPROG && !LIVE && kt.locked + LOCK <= now ->
            FIRST_CLAIM; kt.tok = id; kt.locked = now; kt.fp = fp; EXPIRES; res = O_CLAIM;
            own[id] = now + 1; called = kt.calling;
#ifdef BUG_EXPIRED_FRESH
            got = 0
#else
            got = kt.rp
#endif
#endif
        :: kt.st == INPROG && kt.fp == fp && kt.rp > 0 && LIVE ->
            kt.tok = id; kt.locked = now; res = O_CLAIM; own[id] = now + 1; called = kt.calling;
#ifndef BUG_READ_FIRST
            got = kt.rp
#else
            skip
#endif
        :: kt.st == INPROG && kt.fp == fp && kt.rp == 0 && LIVE -> res = O_BUSY; lk = 0
        fi
    }
    if
    :: res != O_CLAIM -> goto answered
    :: else
    fi;
#endif

    /* The view, from the first step not recorded. code: protocol.steps.Steps.local,
     * protocol.steps.Steps.remote, protocol.steps.Steps.flush */
    i = got;
    pending = false;
    do
    :: i == NSTEPS -> break
    :: i == REMOTE ->
        RENEW(id);
        CRASH_POINT;
#ifdef LIFETIME
        /* Called by an earlier attempt, its result not recorded: again only while the key's
         * first claim is younger than the provider's key lifetime less the longest a live
         * owner may take from this check to its call (a lease and a pause: LOCK + PAUSE),
         * by the database's clock; else refused and the key given back. Not called yet: the
         * mark, in a commit of its own, fenced. code: protocol.steps.Steps._check_lifetime,
         * strategies.stepped.StepClaim.first_claimed_within, strategies.stepped.StepClaim.record */
        if
        :: called ->
#ifndef BUG_FORGOTTEN
            if
            :: kt.created + LIFETIME <= now + LOCK + PAUSE -> goto failed
            :: else
            fi
#else
            skip
#endif
        :: else ->
            atomic {
                if
                :: kt.st == INPROG && kt.tok == id -> kt.calling = true; res = O_CLAIM
                :: else -> res = O_LOST
                fi
            }
            if
            :: res == O_LOST -> goto lost
            :: else
            fi
        fi;
#endif
        /* the provider's call, outside every transaction, with the downstream key of
         * this request and step: the same for every attempt.
         * code: protocol.steps.Steps.downstream_key, protocol.keys.downstream_key */
        PROVIDER_CALL;
        CRASH_POINT;
        ERROR_POINT;
        pending = true; i++
    :: i != REMOTE && i < NSTEPS ->
        RENEW(id);
        CRASH_POINT;
        /* The step's writes and its record (the recovery point, the results, the
         * provider's answer pending from the remote step before it, the completer's
         * request with the first) in one transaction, whose last statement is fenced by
         * the claim token: LeaseLost and a rollback when the claim is no longer this one's.
         * code: strategies.stepped.StepClaim.record, protocol.resend.kept_request */
        atomic {
            if
            :: fresh ->  /* advisory_lock: the claim's row commits with the first step */
                assert(kt.st == NONE);
                kt.st = INPROG; kt.tok = id; kt.fp = fp; kt.rp = 0; kt.sfp = 0; fresh = false;
                kt.kept = false; kt.calling = false; STAMP(claimed); own[id] = now + 1;
                EXPIRES
            :: else
            fi;
#ifdef BUG_NOFENCE
            if
            :: kt.st == INPROG ->
#else
            if
            :: kt.st == INPROG && kt.tok == id ->
#endif
                STEP_COMMITS(i, fp, pending);
                kt.rp = i + 1; kt.sfp = fp; kt.kept = COMPLETER; kt.locked = now;
                if
                :: own[id] != 0 -> own[id] = now + 1
                :: else
                fi;
                res = O_CLAIM
            :: else -> res = O_LOST
            fi
        }
        if
        :: res == O_LOST -> goto lost
        :: else
        fi;
        pending = false; i++;
        ERROR_POINT
    od;
    RENEW(id);
    CRASH_POINT;
    /* The completion, fenced by the token, in the last transaction.
     * code: strategies.db.DatabaseClaim.store, store.sql.owner.complete,
     * protocol.lifecycle.Lifecycle.complete */
    atomic {
        if
        :: kt.st == INPROG && kt.tok == id -> COMPLETES(); kt.st = DONE; EXPIRES; res = O_CLAIM
        :: else -> res = O_LOST
        fi;
        lk = (lk == id -> 0 : lk)
    }
    if
    :: res == O_LOST -> goto lost
    :: else
    fi;
    goto answered;

failed:
    /* The view raised: the claim given back. Deleted when nothing was recorded, else kept
     * in progress under a token no one holds and a lapsed lease, for the next claim.
     * code: strategies.stepped.StepClaim.release, strategies.stepped.StepClaim.hand_back,
     * strategies.stepped.AdvisoryStepClaim.release */
    atomic {
        if
        :: kt.tok == id && kt.st == INPROG ->
#ifdef BUG_DELETE
            kt.st = NONE; kt.tok = 0; kt.rp = 0; kt.sfp = 0; kt.kept = false; kt.calling = false
#else
            if
            :: kt.rp == 0 && !kt.kept && !kt.calling -> kt.st = NONE; kt.tok = 0
            :: else -> kt.tok = HANDED; kt.locked = 0
            fi
#endif
        :: else
        fi;
        lk = (lk == id -> 0 : lk)
    }
    goto answered;

lost:
    /* LeaseLost: the step's transaction rolled back. code: strategies.stepped.AdvisoryStepClaim.lost */
    atomic { lk = (lk == id -> 0 : lk) }
    goto answered;

crashed:
    /* The process dies: its transaction rolls back, its connection closes (and with it a
     * session lock), its heartbeat stops. */
    atomic { lk = (lk == id -> 0 : lk) }

answered:
    atomic {
        own[id] = 0; res = 0; got = 0; i = 0; pending = false; fresh = false; called = false;
        claimed = 0;
        if
        :: !completer -> finished++
        :: else
        fi
    }
    if
    :: completer -> goto again  /* the completer's next run */
    :: else
    fi
}

init {
    atomic {
        run Clock();
        run Request(1, 1, false);
#ifdef OTHER
        run Request(NREQ, 2, false);
#if NREQ > 2
        run Request(2, 1, false);
#endif
#else
        run Request(2, 1, false);
#if NREQ > 2
        run Request(3, 1, false);
#endif
#endif
#if COMPLETER
        run Request(CID, 1, true)
#endif
    }
}
