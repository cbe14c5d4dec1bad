/*
 * django-idempotency: the claim protocol as a Promela model, checked by Spin (make model).
 *
 * NREQ requests (duplicates and retries of one another) on NKEY keys, under one strategy
 * (STRATEGY: DB, ADV, REDIS or HYBRID), race against a clock, crashes, lost replies, Redis
 * outages and a Redis loss (FLUSHALL, a restart without persistence), and the outbox drain.
 * The assertions are the three invariants of docs/how-it-works.md ("What the model proves"):
 *
 *   (a) at most one committed execution per key and TTL          COMMITTED()
 *   (b) no view body starts for a key whose completion was       BODY_STARTS()
 *       delivered or stored and has not expired
 *   (c) every delivered completion is what the key replays       DELIVER()
 *       until it expires
 *
 * Every step names the code it stands for in a comment: "code", a colon, then dotted names
 * relative to django_idempotency; tests/system/test_model.py checks that each one exists,
 * so a change of the protocol shows up in review as a change of this model.
 *
 * Time is the database's clock (now), in ticks; Redis's clock runs at the same rate (its
 * offset cancels: every Redis time is relative, PX). The app server's clock is off by
 * SKEW - 1 ticks (SKEW: 0, 1 or 2, one per configuration) and enters only where the code uses it:
 * the TTL of a Redis refill (store.records.KeyRecord.ttl_seconds).
 */

#ifndef NREQ
#define NREQ 3
#endif
#ifndef NKEY
#define NKEY 1
#endif

#define DB 1
#define ADV 2
#define REDIS 3
#define HYBRID 4
#ifndef STRATEGY
#define STRATEGY DB
#endif

/* Budgets of the environment's faults over one run (the model is exhaustive within them). */
#ifndef CRASHES
#define CRASHES 1
#endif
#ifndef UNKNOWNS
#define UNKNOWNS 1
#endif
#ifndef OUTAGES
#define OUTAGES 1
#endif
#ifndef LOSSES
#define LOSSES 1
#endif

#ifndef SKEW
#define SKEW 1      /* the app server's clock is SKEW - 1 ticks ahead of the database's */
#endif
#define LOCK 1      /* LOCK_TIMEOUT, in ticks: a lease not renewed for LOCK ticks is stale */
#ifndef PAUSE
#define PAUSE 1     /* a live owner's heartbeat may stall this many ticks past its lease */
#endif
#define TTL 2       /* TTL, in ticks */
#ifndef MAXT
#define MAXT 4      /* the clock stops here: every behaviour within MAXT ticks is checked */
#endif

#define NONE 0
#define INPROG 1
#define DONE 2
#define PREP 3      /* a redis-strategy completion written before its COMMIT ("prepared") */

/* What a claim found (strategies.base): */
#define O_CLAIM 1     /* Claim: the view runs */
#define O_REPLAY 2    /* Replay */
#define O_BUSY 3      /* InProgress (409), or LeaseLost (409 lease-lost) */
#define O_UNAVAIL 4   /* StoreUnavailable (503), or the error of a lost reply */
#define O_FALLBACK 5  /* Delegate to the db strategy (hybrid's fallback) */
#define O_UNKNOWN 6   /* the reply of a store call was lost: it may have been applied */
#define O_REFUSED 7   /* Redis refused the connection: nothing was sent */
#define O_PREP 8      /* a prepared record was found (ex: its owner), to settle */
#define O_ABORTED 9   /* its owner's transaction did not commit: delete it, claim again */

/* What the database says of a request's transaction (store.sql.xact): */
#define XC 1          /* committed */
#define XA 2          /* rolled back, or its session ended before COMMIT */

/* The reply of a store call. */
#define R_OK 0
#define R_LOST_APPLIED 1  /* applied, but the reply was lost: unknown to the caller */
#define R_LOST 2          /* not applied, and the reply was lost: unknown to the caller */

#define FRESH (NREQ + 1)  /* the token of a row written without a claim (drain, advisory) */

typedef KeyRow {  /* a row of IdempotencyKey */
    byte st; byte tok; byte locked; byte created; byte exp; byte ex
}
typedef OutRow {  /* a row of IdempotencyOutbox */
    bool on; byte created; byte exp; byte ex
}
typedef RRec {    /* a Redis record: present while exp > now */
    byte st; byte tok; byte exp; byte ex
}

KeyRow kt[NKEY];
OutRow ob[NKEY];
RRec rd[NKEY];
byte lk[NKEY];            /* advisory lock: its holder, 0 when free */
byte now;
byte skew;                /* the app server's clock is now + skew - 1 */
bool redis_up = true;
bool marker = true;       /* the hybrid loss check's marker key */
byte suspect_until;       /* the loss check's suspect window (Redis key "suspect") */
byte episode_until;       /* a fallback episode: new keys are looked up in PostgreSQL */
byte held_until[NKEY];    /* the key's held mark (Redis key ":own"): a claim was made */
byte crashes = CRASHES;
byte unknowns = UNKNOWNS;
byte outages = OUTAGES;
byte losses = LOSSES;
/* Each request's transaction as the database's commit log tells it (0: open, or none). */
byte xact[NREQ + 1];

/* The ghost state the invariants read: which execution's completion committed last for
 * the key, which one was delivered last, and each execution's expiry (executions are
 * named by their request's id). */
byte g_win[NKEY];
byte g_deliv[NKEY];
byte g_exp[NREQ + 2];
byte finished;
/* Requests between two statements that no pause separates in the model (the clock waits):
 * the redis strategy's completion in Redis and its COMMIT (a pause there longer than the
 * TTL would let a second execution commit after the first's record expired). */
byte frozen;
/* The pause assumption (docs/how-it-works.md: LOCK_TIMEOUT well above the longest pause of a
 * live process): own[id] is 1 + the time of the last renewal of request id's lease while it
 * owns a claim, 0 otherwise; the clock never passes the lapse of a live owner's lease by
 * more than PAUSE ticks (a stalled heartbeat; an owner that stalls longer is a crash). */
byte own[NREQ + 1];

#define LIVE_DONE(e) (e != 0 && now < g_exp[e])

/* (a): a commit while another execution's completion of the key is live is a second one. */
#define COMMITTED(k, e, x) assert(!LIVE_DONE(g_win[k])); g_win[k] = e; g_exp[e] = x
/* (b), checked where the request decides to run the view: in the step of its last check
 * (the claim; under hybrid the database check when it runs), atomically. Whatever happens
 * between that decision and the body's first instruction no protocol can see: a process
 * paused there, or a concurrent execution (two bodies of a hybrid key during a fallback
 * episode, of which the outbox lets one commit, which (a) checks). */
#define BODY_STARTS(k) assert(!LIVE_DONE(g_win[k]) && !LIVE_DONE(g_deliv[k]))
/* (c): what a client receives for the key while a delivered completion is live is that
 * completion. An answer that reaches its client after its own record expired protects
 * nothing, and is not checked. Also: no replay of an execution that never committed
 * (BUG_PHANTOM models the redis strategy before its prepared completion, and the model finds
 * it: a worker killed between its completion in Redis and its COMMIT was replayed;
 * docs/how-it-works.md, "What the model proves"). */
#define PHANTOM(e) assert(g_exp[e] != 0)
#define DELIVER(k, e) \
    PHANTOM(e); \
    if \
    :: now < g_exp[e] -> assert(!LIVE_DONE(g_deliv[k]) || g_deliv[k] == e); g_deliv[k] = e \
    :: else \
    fi

/* The key row is free for a takeover: a stale lease, or a completed key past its TTL.
 * code: store.sql.schema.Schema.free, store.sql.schema.Schema.stale, store.sql.parts.lapsed */
#define KT_FREE(k) ((kt[k].st == DONE && kt[k].exp <= now) || \
                    (kt[k].st == INPROG && kt[k].locked + LOCK <= now))
#define KT_LIVE(k) (kt[k].st != NONE && !KT_FREE(k))
#define OB_LIVE(k) (ob[k].on && ob[k].exp > now)
#define EPISODE(until) if :: episode_until < (until) -> episode_until = (until) :: else fi

/* A store call's reply: answered, or lost after it was (or was not) applied. */
inline reply(r) {
    if
    :: r = R_OK
    :: unknowns > 0 -> unknowns--; r = R_LOST_APPLIED
    :: unknowns > 0 -> unknowns--; r = R_LOST
    fi
}

/* The request's process dies here (a worker killed): its transaction rolls back, its
 * connection closes (and with it an advisory lock), its heartbeat stops. */
#define CRASH_POINT if :: crashes > 0 -> crashes--; goto crashed :: true fi
/* (A crash between the claim and the view is a crash after a view that renewed nothing.) */

inline kt_clear(k) {
    kt[k].st = NONE; kt[k].tok = 0; kt[k].locked = 0; kt[k].created = 0; kt[k].exp = 0;
    kt[k].ex = 0
}
inline kt_claim(k, id) {
    kt[k].st = INPROG; kt[k].tok = id; kt[k].locked = now; kt[k].created = now;
    kt[k].exp = now + TTL; kt[k].ex = 0
}
inline rd_clear(k) {
    rd[k].st = NONE; rd[k].tok = 0; rd[k].exp = 0; rd[k].ex = 0
}

/* ---- the db strategy's statements (also the hybrid strategy's fallback) ---------------- */

/* code: strategies.db.DatabaseStrategy.claim, store.managers.KeyStatements.claim,
 * store.managers.KeyStatements._claim_once, store.managers.KeyStatements._take_over,
 * store.sql.claim.claim, store.sql.claim.take_over
 * The INSERT (nothing while the outbox holds a live row), the loser's read, the takeover
 * of a free row re-checked on its token: each re-checks the row, so they are one step. A
 * lost reply is a DatabaseError: 503, whatever was applied (StoreUnavailable). */
inline db_claim(k, id, res, ex) {
    atomic {
        reply(r);
        if
        :: r == R_LOST -> res = O_UNAVAIL
        :: else ->
            if
            :: OB_LIVE(k) -> res = O_REPLAY; ex = ob[k].ex
            :: !OB_LIVE(k) && (kt[k].st == NONE || KT_FREE(k)) ->
                kt_claim(k, id); res = O_CLAIM; own[id] = now + 1
            :: !OB_LIVE(k) && KT_LIVE(k) && kt[k].st == DONE -> res = O_REPLAY; ex = kt[k].ex
            :: !OB_LIVE(k) && KT_LIVE(k) && kt[k].st == INPROG -> res = O_BUSY
            fi;
            if
            :: r == R_LOST_APPLIED -> res = O_UNAVAIL; ex = 0; own[id] = 0
            :: else
            fi
        fi;
        if
        :: res == O_CLAIM -> BODY_STARTS(k)
        :: else
        fi;
#if STRATEGY == HYBRID && !defined(BUG_EPISODES)
        /* the fallback episode, seen by every process from the claim on, for as long as
         * the claim can live (issue 24, wanted 2); the code notes it in the key's database,
         * which the other processes read once a second (not modelled: the model's processes
         * see it at once).
         * code: strategies.hybrid.suspect, strategies.hybrid.HybridStrategy.read_suspects */
        EPISODE(now + LOCK + TTL)
#else
        skip
#endif
    }
}

/* The heartbeat: code: protocol.lease.LeaseKeeper._renew, strategies.db.DatabaseClaim.renew,
 * store.managers.KeyStatements.renew, store.sql.owner.renew (fenced by the token) */
/* Under hybrid, which of the two a request renews (one guard: an option of the heartbeat
 * loop is taken only when it can run). */
#if STRATEGY == HYBRID
#define FB_GUARD fallback &&
#define RD_GUARD !fallback &&
#else
#define FB_GUARD
#define RD_GUARD
#endif
#if STRATEGY == HYBRID && !defined(BUG_EPISODES)
#define RENEW_EPISODE EPISODE(now + LOCK + TTL)  /* the fallback episode lasts with the claim */
#else
#define RENEW_EPISODE skip
#endif
#define DB_RENEW(k, id) atomic { FB_GUARD kt[k].st == INPROG && kt[k].tok == id && kt[k].locked < now -> \
                                 kt[k].locked = now; own[id] = now + 1; \
                                 RENEW_EPISODE }

/* code: strategies.db.DatabaseClaim.release, store.managers.KeyStatements.release,
 * store.sql.owner.release: the in-progress row deleted, only under this claim's token */
inline db_release(k, id) {
    atomic {
        reply(r);
        if
        :: r != R_LOST && kt[k].st == INPROG && kt[k].tok == id -> kt_clear(k)
        :: else
        fi
    }
}

/* ---- Redis ------------------------------------------------------------------------------ */

/* The held mark written (or renewed with the lease): twice the lease, and the TTL. */
#if STRATEGY == HYBRID && !defined(BUG_TAKEOVER)
#define HOLD(k) held_until[k] = now + LOCK + LOCK + TTL
#else
#define HOLD(k) skip
#endif

/* code: strategies.redis.store.RedisStore.claim, strategies.redis.strategy.redis_claim,
 * strategies.redis.store.RedisStore.claim_checking_loss, strategies.redis.store.CLAIM_LUA
 * SET NX PX lease GET: won when absent, or when the record is this claim's own (a resend
 * of the same token after a lost reply); else what the record says. Under hybrid, when won,
 * the loss check in the same script: a missing marker opens the suspect window. */
inline redis_set_nx(k, id, res, ex) {
    if
    :: rd[k].st == NONE || (rd[k].st == INPROG && rd[k].tok == id) ->
        rd[k].st = INPROG; rd[k].tok = id; rd[k].exp = now + LOCK; rd[k].ex = 0; res = O_CLAIM;
        own[id] = now + 1;
#if STRATEGY == HYBRID
        /* code: strategies.redis.store._LOSS_FUNCTION, strategies.hybrid.HybridStrategy._loss_reported */
        if
        :: !marker -> marker = true; suspect_until = now + TTL
        :: else
        fi;
        /* code: strategies.hybrid.HybridStrategy._must_check_db: a loss suspected, or a
         * fallback episode (issue 24, wanted 2), or the key taken over from an earlier
         * claim whose lease lapsed: its held mark lives (code: strategies.redis.store._HELD_FUNCTION,
         * strategies.hybrid.HybridStrategy._held_ms; BUG_TAKEOVER: as coded before, no mark,
         * and the model finds a second run of the view body of a key committed by an owner
         * killed before its publication) */
#ifdef DB_CHECK_ALWAYS
        check_db = true;  /* HYBRID_DB_CHECK = "always" */
#elif defined(BUG_TAKEOVER)
        check_db = (now < suspect_until || now < episode_until);
#else
        check_db = (now < suspect_until || now < episode_until || now < held_until[k]);
#endif
        HOLD(k)
#endif
    :: rd[k].st == DONE -> res = O_REPLAY; ex = rd[k].ex
    :: rd[k].st == PREP -> res = O_PREP; ex = rd[k].ex  /* its owner, whose token it holds */
    :: rd[k].st == INPROG && rd[k].tok != id -> res = O_BUSY
    fi
}

/* A won Redis claim runs the view unless hybrid looks the key up in the database first. */
#if STRATEGY == HYBRID
#define DECIDED(k) if :: res == O_CLAIM && !check_db -> BODY_STARTS(k) :: else fi
#else
#define DECIDED(k) if :: res == O_CLAIM -> BODY_STARTS(k) :: else fi
#endif

inline redis_claim(k, id, res, ex) {
    atomic {
        if
        :: !redis_up -> res = O_REFUSED
        :: redis_up ->
            reply(r);
            if
            :: r == R_LOST -> res = O_UNKNOWN
            :: else ->
                redis_set_nx(k, id, res, ex);
                if
                :: r == R_LOST_APPLIED -> res = O_UNKNOWN; ex = 0; own[id] = 0
                :: else
                fi
            fi
        fi;
        DECIDED(k)
    }
#ifdef UNKNOWN_FALLS_BACK
    /* as coded before issue 24: a lost reply taken for "Redis is down" */
    if
    :: res == O_UNKNOWN -> res = O_REFUSED
    :: else
    fi;
#endif
    if
    :: res == O_UNKNOWN ->
        /* A lost reply is its own outcome, never "Redis is down": the claim is sent
         * again with the same token (its own record counts as won), or the answer is 503.
         * code: strategies.redis.strategy.RedisStrategy.claim,
         * strategies.redis.strategy.RedisStrategy.unavailable (issue 24, wanted 1: a
         * timeout never falls back to the db strategy) */
        if
        :: res = O_UNAVAIL
        :: atomic { redis_up -> redis_set_nx(k, id, res, ex); DECIDED(k) }
        fi
    :: else
    fi
#if STRATEGY == REDIS  /* only the redis strategy writes prepared records */
    ;
    if
    :: res == O_PREP -> settle_prepared(k, id, res, ex)
    :: else
    fi
#endif
}

/* A prepared record found by a claim: its owner's transaction asked of the database, in a
 * statement of its own (a lost reply is a 503). Committed: confirmed and replayed; open:
 * in progress; rolled back: deleted on its owner's token, and the key claimed again (a
 * record found prepared again is answered as busy).
 * code: strategies.redis.prepared.settle_prepared, store.sql.xact.transaction_outcome,
 * strategies.redis.store.RedisStore.confirm, strategies.redis.store.RedisStore.discard */
inline settle_prepared(k, id, res, ex) {
    atomic {
        reply(r);
        if
        :: r != R_OK -> res = O_UNAVAIL; ex = 0
        :: r == R_OK && xact[ex] == XC ->
            if
            :: redis_up && rd[k].st == PREP && rd[k].tok == ex -> rd[k].st = DONE
            :: else
            fi;
            res = O_REPLAY
        :: r == R_OK && xact[ex] == 0 -> res = O_BUSY; ex = 0
        :: r == R_OK && xact[ex] == XA -> res = O_ABORTED
        fi
    }
    if
    :: res == O_ABORTED ->
        redis_delete(k, ex, true);
        atomic {
            if
            :: redis_up ->
                redis_set_nx(k, id, res, ex);
                if
                :: res == O_PREP -> res = O_BUSY; ex = 0
                :: else
                fi;
                DECIDED(k)
            :: else -> res = O_UNAVAIL; ex = 0
            fi
        }
    :: else
    fi
}

/* code: protocol.lease.LeaseKeeper._renew, strategies.redis.strategy.RedisClaim.renew,
 * strategies.redis.store.RedisStore.renew, strategies.redis.store.RENEW_LUA; under hybrid
 * with the held mark: code: strategies.hybrid.HybridClaim.renew */
#define REDIS_RENEW(k, id) atomic { RD_GUARD redis_up && rd[k].st == INPROG && rd[k].tok == id && \
                                    rd[k].exp < now + LOCK -> rd[k].exp = now + LOCK; \
                                    own[id] = now + 1; HOLD(k) }

/* code: strategies.redis.strategy.RedisClaim.release, strategies.redis.store.RedisStore.release,
 * strategies.redis.store.RELEASE_LUA (in progress under this token only); with d: code:
 * strategies.redis.strategy.RedisClaim.discard, strategies.redis.store.DISCARD_LUA (either
 * state). A failure is logged: the record lapses. */
inline redis_delete(k, id, d) {
    atomic {
        if
        :: redis_up ->
            reply(r);
            if
            :: r != R_LOST && rd[k].tok == id && (rd[k].st == INPROG || d) -> rd_clear(k)
            :: else
            fi
        :: else
        fi
    }
}

/* code: strategies.redis.store.RedisStore.put_completed (one SET, no compare-and-set);
 * ok: whether Redis answered. */
/* episode: a failure of this put is a fallback episode (HybridClaim.publish) */
inline redis_put(pk, ptok, pe, px, pok, episode) {
    atomic {
        pok = false;
        if
        :: redis_up ->
            reply(r);
            if
            :: r != R_LOST -> rd[pk].st = DONE; rd[pk].tok = ptok; rd[pk].ex = pe; rd[pk].exp = px
            :: else
            fi;
            pok = (r == R_OK)
        :: else
        fi;
        if
        :: rd[pk].st != NONE && rd[pk].exp <= now -> rd_clear(pk)
        :: else
        fi;
#ifndef BUG_EPISODES
        if
        :: !pok && episode -> EPISODE(now + TTL)
        :: else
        fi
#else
        skip
#endif
    }
}

/* ---- hybrid: the outbox and PostgreSQL's view of the key -------------------------------- */

/* code: strategies.hybrid.HybridStrategy.lookup, store.outbox.IdempotencyOutboxManager.lookup,
 * store.sql.read.read_live: the live outbox row first, else a key row not past expires_at */
inline lookup(k, fst, fex, fexp, decides) {
    atomic {
        reply(r);
        if
        :: r != R_OK -> fst = O_UNAVAIL
        :: OB_LIVE(k) -> fst = DONE; fex = ob[k].ex; fexp = ob[k].exp
        :: !OB_LIVE(k) && kt[k].st != NONE && kt[k].exp > now ->
            fst = kt[k].st; fex = kt[k].ex; fexp = kt[k].exp
        :: else -> fst = NONE
        fi;
        if
        :: decides && fst == NONE -> BODY_STARTS(k)
        :: else
        fi
    }
}

/* code: strategies.hybrid.HybridStrategy.refill, store.records.KeyRecord.ttl_seconds: the
 * record's remaining TTL on the app server's clock */
inline refill(k, id, fex, fexp, ok) {
    if
    :: fexp + 1 > now + skew -> redis_put(k, id, fex, fexp + 1 - skew, ok, false)
    :: else  /* already expired by the app's clock: a TTL of 0 */
    fi
}

/* The drain: code: store.outbox.IdempotencyOutboxManager.drain, store.sql.drain.drain_batch
 * A live row is written as the key's completed row (fresh token), unless the key row was
 * created at or after the row's expiry (a newer record); every row leaves the outbox. */
proctype Drain() {
    byte k;
end:
    do
    :: atomic {
        if
        :: ob[0].on -> k = 0
#if NKEY > 1
        :: ob[1].on -> k = 1
#endif
        fi;
        if
        :: ob[k].exp > now && !(kt[k].st != NONE && kt[k].created >= ob[k].exp) ->
            kt[k].st = DONE; kt[k].tok = FRESH; kt[k].locked = 0; kt[k].created = ob[k].created;
            kt[k].exp = ob[k].exp; kt[k].ex = ob[k].ex
        :: else
        fi;
        ob[k].on = false; ob[k].created = 0; ob[k].exp = 0; ob[k].ex = 0; k = 0
    }
    :: finished == NREQ -> break
    od
}

/* ---- the environment -------------------------------------------------------------------- */

/* The clock may tick: not past MAXT, not in a frozen window, and no live owner's lease
 * lapsed PAUSE ticks ago. */
#define LAPSED(i) (own[i] != 0 && own[i] - 1 + LOCK + PAUSE <= now)
#if NREQ > 2
#define OWNERS_LIVE (!LAPSED(1) && !LAPSED(2) && !LAPSED(3))
#else
#define OWNERS_LIVE (!LAPSED(1) && !LAPSED(2))
#endif

proctype Clock() {
    byte k;
end:
    do
    :: atomic {
        now < MAXT && finished < NREQ && frozen == 0 && OWNERS_LIVE -> now++;
        /* Redis expires its records (PX) */
        for (k : 0 .. NKEY - 1) {
            if
            :: rd[k].st != NONE && rd[k].exp <= now -> rd_clear(k)
            :: else
            fi
        };
        k = 0
    }
    :: finished == NREQ || now == MAXT -> break
    od
}

proctype Redis() {
    byte k;
end:
    do
    :: atomic { outages > 0 && redis_up -> outages--; redis_up = false }
    :: atomic { !redis_up -> redis_up = true }
    :: atomic {
        /* FLUSHALL, or a restart without persistence: every record and the marker lost */
        losses > 0 -> losses--;
        for (k : 0 .. NKEY - 1) { rd_clear(k); held_until[k] = 0 }
        marker = false; suspect_until = 0
    }
    :: finished == NREQ -> break
    od
}

/* ---- one request ------------------------------------------------------------------------ */

/* A finished request forgets its locals (fewer states to tell apart). */
#define FORGET r = 0; res = 0; ex = 0; fst = 0; fex = 0; fexp = 0; x = 0; ok = 0; \
               check_db = 0; fallback = 0

proctype Request(byte id; byte k) {
    byte r, res, ex, fst, fex, fexp, x;
    bool ok, check_db, fallback;

#if STRATEGY == DB || STRATEGY == HYBRID
#if STRATEGY == HYBRID
    /* code: strategies.hybrid.HybridStrategy.claim, strategies.hybrid.HybridStrategy._claim */
    redis_claim(k, id, res, ex);
    if
    :: res == O_REFUSED ->
        /* Redis refused: the db strategy takes the request, counted in the fallback episode.
         * code: strategies.redis.strategy.RedisStrategy.unavailable,
         * strategies.redis.health.FallbackMonitor.fell_back */
        res = O_FALLBACK
    :: else
    fi;
    if
    :: res == O_CLAIM ->
        if
        :: check_db ->
            /* code: strategies.hybrid.HybridClaim.settled, protocol.lifecycle.Lifecycle._settle_and_begin */
            lookup(k, fst, fex, fexp, true);
            if
            :: fst == O_UNAVAIL -> redis_delete(k, id, false); res = O_UNAVAIL  /* discard */
            :: fst == DONE ->
                /* code: strategies.hybrid.HybridStrategy.settle, protocol.lifecycle.Lifecycle._enter
                 * refilled, replayed, and the Redis claim released (SETTLED) */
                refill(k, id, fex, fexp, ok);
                redis_delete(k, id, false);
                res = O_REPLAY; ex = fex; ok = false
            :: fst == INPROG ->
                /* a db claim holds the key: the db strategy answers (code:
                 * strategies.hybrid.HybridStrategy.settle, protocol.lifecycle.Lifecycle._delegate) */
                redis_delete(k, id, false);
                res = O_FALLBACK
            :: fst == NONE
            fi
        :: else
        fi
    :: else
    fi;
    if
    :: res == O_FALLBACK ->
        fallback = true;
        db_claim(k, id, res, ex)
    :: else
    fi;
#else
    db_claim(k, id, res, ex);
#endif
    if
    :: res != O_CLAIM -> goto answered
    :: else
    fi;

    /* The view's body runs in its transaction, with the heartbeat.
     * code: protocol.lifecycle.Lifecycle._enter, protocol.lease.Keeping */
    do
#if STRATEGY == HYBRID
    :: REDIS_RENEW(k, id)
    :: DB_RENEW(k, id)
#else
    :: DB_RENEW(k, id)
#endif
    :: break
    od;
    CRASH_POINT;
    if
    :: true
    :: /* the view answers a response that is not stored (a 5xx, an exception): the key
        * is given back. code: protocol.lifecycle.Lifecycle.release, protocol.lifecycle.Lifecycle._settle */
#if STRATEGY == HYBRID
        if
        :: fallback -> db_release(k, id)
        :: else -> redis_delete(k, id, false)
        fi;
#else
        db_release(k, id);
#endif
        goto done
    fi;

#if STRATEGY == HYBRID
    if
    :: !fallback ->
        /* The outbox row, fenced by IdempotencyKey's row, and COMMIT in one statement.
         * code: strategies.hybrid.HybridClaim.store, strategies.hybrid.outbox_write,
         * store.outbox.IdempotencyOutboxManager.add, store.sql.outbox.outbox_add_fenced,
         * store.sql.outbox.fence_ctes, protocol.lifecycle.Lifecycle.complete */
        atomic {
            reply(r);
            res = O_BUSY;
            if
            :: r != R_LOST && !KT_LIVE(k) && !OB_LIVE(k) ->
                if
                :: kt[k].st == INPROG -> kt_clear(k)  /* a stale db claim: fenced out */
                :: else
                fi;
                ob[k].on = true; ob[k].created = now; ob[k].ex = id;
#ifdef OUTBOX_APP_CLOCK
                /* the row's expiry on the app server's clock (issue 24, item 5) */
                ob[k].exp = now + skew - 1 + TTL;
#else
                ob[k].exp = now + TTL;
#endif
                COMMITTED(k, id, now + TTL);  /* the TTL the client was promised */
                res = O_CLAIM
            :: else
            fi;
            if
            :: r != R_OK -> res = O_UNAVAIL
            :: else
            fi
        }
    :: fallback ->
        /* The outbox row and the fenced completion, then Django's COMMIT.
         * code: strategies.hybrid.OutboxDatabaseClaim.store, strategies.db.DatabaseClaim.store,
         * store.managers.KeyStatements.complete, store.sql.owner.complete */
        atomic {
            reply(r);
            res = O_BUSY;
            if
            :: r != R_LOST && !OB_LIVE(k) && kt[k].st == INPROG && kt[k].tok == id ->
                kt[k].st = DONE; kt[k].locked = 0; kt[k].exp = now + TTL; kt[k].ex = id;
                ob[k].on = true; ob[k].created = now; ob[k].ex = id; ob[k].exp = now + TTL;
                COMMITTED(k, id, now + TTL);
#ifndef BUG_EPISODES
                /* and with the commit, as long as the completion lives */
                EPISODE(now + TTL);
#endif
                res = O_CLAIM
            :: else
            fi;
            if
            :: r != R_OK -> res = O_UNAVAIL
            :: else
            fi
        }
    fi;
    if
    :: res == O_UNAVAIL ->
        /* the commit's outcome is unknown to the request: it gives the key back.
         * code: protocol.lifecycle.Lifecycle._settle, strategies.hybrid.HybridClaim.discard */
        if
        :: fallback -> db_release(k, id)
        :: else -> redis_delete(k, id, false)
        fi;
        goto answered
    :: res == O_BUSY ->
        /* LeaseLost. code: strategies.hybrid.HybridClaim.lost: the winner's record into
         * Redis, else the claim released */
        if
        :: !fallback ->
            lookup(k, fst, fex, fexp, false);
            if
            :: fst == DONE -> refill(k, id, fex, fexp, ok)
            :: else -> redis_delete(k, id, false)
            fi
        :: else
        fi;
        goto answered
    :: else
    fi;
    CRASH_POINT;
    if
    :: !fallback ->
        /* code: strategies.hybrid.HybridClaim.after_commit, strategies.hybrid.HybridClaim.publish
         * A publish that failed is a fallback episode too, noted at once (issue 24, wanted 2;
         * as coded, with BUG_EPISODES, only verify_due is set). */
        redis_put(k, id, id, now + TTL, ok, true)
    :: else
    fi;
#else
    /* The fenced completion and COMMIT in one statement.
     * code: strategies.db.DatabaseClaim.store, store.managers.KeyStatements.complete,
     * store.sql.owner.complete, protocol.lifecycle.Lifecycle.complete */
    atomic {
        reply(r);
        res = O_BUSY;
        if
        :: r != R_LOST && kt[k].st == INPROG && kt[k].tok == id ->
            kt[k].st = DONE; kt[k].locked = 0; kt[k].exp = now + TTL; kt[k].ex = id;
            COMMITTED(k, id, now + TTL);
            res = O_CLAIM
        :: else
        fi;
        if
        :: r != R_OK -> res = O_UNAVAIL
        :: else
        fi
    }
    if
    :: res == O_UNAVAIL -> db_release(k, id); goto answered  /* code: strategies.db.DatabaseClaim.release */
    :: res == O_BUSY -> goto answered  /* LeaseLost: code: strategies.base.Claim.lost */
    :: else
    fi;
#endif
    res = O_CLAIM; ex = id;
#endif /* DB || HYBRID */

#if STRATEGY == ADV
    /* code: strategies.advisory.AdvisoryLockStrategy.claim, strategies.advisory.lock: the
     * transaction's advisory lock, or a 409 when the wait for it ends (the lock timeout) */
    if
    :: atomic { lk[k] == 0 -> lk[k] = id }
    :: res = O_BUSY; goto answered
    fi;
    /* code: store.managers.KeyStatements.read, store.sql.read.read_live */
    atomic {
        reply(r);
        if
        :: r != R_OK -> res = O_UNAVAIL; lk[k] = 0  /* the transaction abandoned */
        :: r == R_OK && kt[k].st == DONE && kt[k].exp > now -> res = O_REPLAY; ex = kt[k].ex; lk[k] = 0
        :: r == R_OK && !(kt[k].st == DONE && kt[k].exp > now) -> res = O_CLAIM; BODY_STARTS(k)
        fi
    }
    if
    :: res != O_CLAIM -> goto answered
    :: else
    fi;
    CRASH_POINT;
    if
    :: true
    :: lk[k] = 0; goto done  /* released: the transaction rolls back, and the lock with it */
    fi;
    /* The completed record (over an absent or expired one only) and COMMIT, in one statement;
     * the lock ends with the transaction.
     * code: strategies.advisory.AdvisoryClaim.store, store.managers.KeyStatements.store_completed,
     * store.sql.completed.store */
    atomic {
        reply(r);
        res = O_BUSY;
        if
        :: r != R_LOST && (kt[k].st == NONE || kt[k].exp <= now) ->
            kt[k].st = DONE; kt[k].tok = FRESH; kt[k].locked = 0; kt[k].created = now;
            kt[k].exp = now + TTL; kt[k].ex = id;
            COMMITTED(k, id, now + TTL);
            res = O_CLAIM
        :: else
        fi;
        if
        :: r != R_OK -> res = O_UNAVAIL
        :: else
        fi;
        lk[k] = 0
    }
    if
    :: res != O_CLAIM -> goto answered
    :: else
    fi;
    ex = id;
#endif

#if STRATEGY == REDIS
    /* REDIS_FAILURE_MODE = "fail_closed" (with "db", Redis and the fallback do not see each
     * other: docs/redis.md, Limitations). code: strategies.redis.strategy.RedisStrategy.claim */
    redis_claim(k, id, res, ex);
    if
    :: res != O_CLAIM -> goto answered
    :: else
    fi;
    do
    :: REDIS_RENEW(k, id)
    :: break
    od;
    CRASH_POINT;
    if
    :: true
    :: redis_delete(k, id, false); goto done  /* released */
    fi;
    /* The response by compare-and-set on the token, before COMMIT: prepared, naming the
     * transaction (BUG_PHANTOM: completed, as coded before).
     * code: strategies.redis.strategy.RedisClaim.store, strategies.redis.store.RedisStore.complete,
     * strategies.redis.store.COMPLETE_LUA, store.sql.xact.transaction_id */
    atomic {
        res = O_UNAVAIL;
        if
        :: redis_up ->
            reply(r);
            if
            :: r != R_LOST && rd[k].st == INPROG && rd[k].tok == id ->
#ifdef BUG_PHANTOM
                rd[k].st = DONE;
#else
                rd[k].st = PREP;
#endif
                rd[k].exp = now + TTL; rd[k].ex = id; x = now + TTL;
                res = O_CLAIM; frozen++
            :: r != R_LOST && !(rd[k].st == INPROG && rd[k].tok == id) -> res = O_BUSY
            :: else
            fi;
            if
            :: r != R_OK -> res = O_UNAVAIL
            :: else
            fi
        :: else
        fi
    }
    if
    :: res == O_UNAVAIL -> xact[id] = XA; redis_delete(k, id, true); goto answered  /* discard */
    :: res == O_BUSY -> goto answered
    :: else
    fi;
    if
    :: crashes > 0 -> crashes--; frozen--; goto crashed  /* in Redis only: rolled back */
    :: true
    fi;
    /* COMMIT of the view's transaction. Its answer may be lost (DATABASE_TIMEOUT cuts it,
     * the connection drops) after or before it was applied: a 503, and the prepared record
     * is kept for a retry to settle (BUG_PHANTOM: every COMMIT answered).
     * code: protocol.lifecycle.Lifecycle._end, protocol.lifecycle.Lifecycle._settle,
     * strategies.redis.strategy.RedisClaim.commit_unknown */
    atomic {
#ifdef BUG_PHANTOM
        r = R_OK;
#else
        reply(r);
#endif
        if
        :: r != R_LOST -> COMMITTED(k, id, x); xact[id] = XC
        :: else -> xact[id] = XA
        fi;
        frozen--;
        if
        :: r != R_OK -> res = O_UNAVAIL
        :: else
        fi
    };
    if
    :: res == O_UNAVAIL -> goto answered
    :: else
    fi;
    CRASH_POINT;
#ifndef BUG_PHANTOM
    /* After COMMIT: the record confirmed (a failure leaves it prepared, for a retry to settle).
     * code: strategies.redis.strategy.RedisClaim.after_commit, strategies.redis.store.RedisStore.confirm,
     * strategies.redis.store.CONFIRM_LUA */
    atomic {
        if
        :: redis_up ->
            reply(r);
            if
            :: r != R_LOST && rd[k].st == PREP && rd[k].tok == id -> rd[k].st = DONE
            :: else
            fi
        :: else
        fi
    };
#endif
    ex = id;
#endif

    /* The response reaches the client. */
    atomic { DELIVER(k, ex); own[id] = 0; finished++; FORGET };
    goto end;

answered:
    atomic {
        if
        :: res == O_REPLAY -> DELIVER(k, ex)
        :: else
        fi;
        own[id] = 0; finished++; FORGET
    };
    goto end;

crashed:
    atomic {
#if STRATEGY == REDIS
        if
        :: xact[id] == 0 -> xact[id] = XA  /* its session ends: PostgreSQL rolls it back */
        :: else
        fi;
#endif
#if STRATEGY == ADV
        if
        :: lk[k] == id -> lk[k] = 0
        :: else
        fi;
#endif
        own[id] = 0; finished++; FORGET
    };
    goto end;

done:
    atomic { own[id] = 0; finished++; FORGET };
end:
    skip
}

init {
    byte i;
    atomic {
        skew = SKEW;
        run Clock();
#if STRATEGY == REDIS || STRATEGY == HYBRID
        run Redis();
#endif
#if STRATEGY == HYBRID
        run Drain();
#endif
        for (i : 1 .. NREQ) {
            run Request(i, (i - 1) % NKEY)
        }
    }
}
