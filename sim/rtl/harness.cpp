// Fast frame-level harness around a Verilated AXI-Stream top (see fastsim.py for the contract).
//
// Python talks frames, never beats: it queues whole input frames per port, runs N cycles in one
// call, and pops whole output frames (bytes, error flag, cycle of the last beat). AXI4-Lite
// transactions run here too. Per-design port accessors come from the generated nr_ports.h.
//
// Clocking per cycle: drive inputs (clk low) -> eval (combinational settle: tready may depend on
// tvalid) -> sample handshakes (valid && ready) -> clk high -> eval (flops update). A beat counts
// as transferred in the cycle whose rising edge saw valid && ready, as in the cocotb drivers.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "Vtop.h"
#include "verilated.h"
#include "nr_ports.h"
#include "nr_edge.h"

#if NR_FAST_EDGE
#include "Vtop___024root.h"
// The phases of Vtop___024root___eval (the model's eval() body) that follow its
// input-combinational region; fastsim.py checked at build time that this Verilator's eval() is
// exactly those three loops, else NR_FAST_EDGE is 0 and plain eval() is used.
bool Vtop___024root___eval_phase__act(Vtop___024root* vlSelf);
bool Vtop___024root___eval_phase__nba(Vtop___024root* vlSelf);
#endif

namespace {

struct InFrame {
    std::vector<uint8_t> bytes;
    bool err;
};

struct InPort {
    std::deque<InFrame> q;
    std::deque<std::pair<uint64_t, InFrame>> later;  // nr_send_at: (cycle, frame), cycle order
    size_t off = 0;           // bytes of q.front() already transferred
    bool presenting = false;  // tvalid is high (must stay high until the handshake)
    uint32_t data[NR_WORDS];
    uint64_t keep = 0;
    bool last = false;
    uint64_t user = 0;
    uint32_t vnum = 1, vden = 1;  // probability of offering a new beat in a cycle
};

struct OutFrame {
    int port;
    std::vector<uint8_t> bytes;
    bool err;
    uint64_t cycle;
};

struct OutPort {
    std::vector<uint8_t> cur;
    bool in_frame = false;
    bool ready = true;
    uint32_t rnum = 1, rden = 1;  // probability of tready high in a cycle
};

enum AxilState { AX_IDLE, AX_WRITE, AX_WRESP, AX_READ, AX_RRESP };

struct Axil {
    AxilState st = AX_IDLE;
    bool aw_done = false, w_done = false;
    uint32_t addr = 0, data = 0, strb = 0xF;
    uint32_t rdata = 0;
    int resp = 0;
};

// nr_run_async: one thread per Sim runs the clock while the caller does other work (Python
// without the GIL held here: only nr_join, which blocks in C, waits for it).
// Both sides spin for a few tens of microseconds before sleeping on the condition variable: the
// caller usually starts the next run (and the run usually ends) within that, and a sleep and
// wake-up cost about as much again per run, for runs of a few hundred microseconds.
struct Worker {
    std::thread th;
    std::mutex m;
    std::condition_variable cv;
    uint64_t todo = 0;
    std::atomic<bool> busy{false}, quit{false};
    uint64_t wall_ns = 0, cpu_ns = 0;  // spent in asynchronous runs
};

struct Sim {
    Worker* worker = nullptr;
    VerilatedContext* ctx;
    Vtop* top;
    uint64_t cycle = 0;
    uint64_t last_activity = 0;
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    uint64_t beats_in = 0, beats_out = 0, frames_in = 0, frames_out = 0;
    uint64_t protocol_errors = 0;
    InPort in[NR_NIN > 0 ? NR_NIN : 1];
    OutPort out[NR_NOUT > 0 ? NR_NOUT : 1];
    std::deque<OutFrame> outs;
    // outputs handed over when nr_run_async starts a run: the caller pops them (nr_out_pop,
    // oldest first) while the worker appends to outs, so the run need not wait for that
    std::deque<OutFrame> handed;
    Axil ax;
    bool new_output = false;
    bool fast_edge = false;  // rising edges without the input-combinational region (nr_fast_edge)
};

// The rising-edge eval(). With fast_edge, eval() less its input-combinational region (ico): the
// inputs are those the clock-low eval() of the same cycle settled and nothing else changed since,
// so ico would recompute the same values (the 512-bit engine's RTL runs 14% faster; the outputs
// are the same either way: tested).
inline void eval_rising(Sim* s) {
    Vtop* t = s->top;
    t->clk = 1;
#if NR_FAST_EDGE
    if (s->fast_edge) {
        Vtop___024root* r = t->rootp;
        int n = 0;
        do {
            if (++n > 10000) {
                VL_FATAL_MT("nr_harness", 0, "", "NBA region did not converge (fast edge)");
            }
            r->__VactIterCount = 0;
            do {
                r->__VactIterCount++;
                r->__VactPhaseResult = Vtop___024root___eval_phase__act(r);
            } while (r->__VactPhaseResult);
            r->__VnbaPhaseResult = Vtop___024root___eval_phase__nba(r);
        } while (r->__VnbaPhaseResult);
        return;
    }
#endif
    t->eval();
}

inline uint32_t rnd32(Sim* s) {  // xorshift64*
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    return (uint32_t)((s->rng * 2685821657736338717ull) >> 32);
}

inline bool chance(Sim* s, uint32_t num, uint32_t den) {
    if (num >= den) return true;
    if (num == 0) return false;
    return (rnd32(s) % den) < num;
}

void load_beat(InPort& ip) {
    const InFrame& f = ip.q.front();
    size_t n = f.bytes.size() - ip.off;
    if (n > NR_BYTES) n = NR_BYTES;
    std::memset(ip.data, 0, sizeof ip.data);
    std::memcpy(ip.data, f.bytes.data() + ip.off, n);
    ip.keep = (n >= 64) ? ~0ull : ((1ull << n) - 1);
    ip.last = ip.off + n >= f.bytes.size();
    ip.user = 0;
    (void)0;
}

void step(Sim* s) {
    Vtop* t = s->top;
    // ---- drive (clock low)
    for (int p = 0; p < NR_NIN; p++) {
        InPort& ip = s->in[p];
        // frames queued for a later cycle join the port's queue in the cycle they are due, as
        // if nr_send had been called when the clock got there
        while (!ip.later.empty() && ip.later.front().first <= s->cycle) {
            ip.q.push_back(std::move(ip.later.front().second));
            ip.later.pop_front();
        }
        if (!ip.presenting && !ip.q.empty() && chance(s, ip.vnum, ip.vden)) {
            load_beat(ip);
            int eb = nr_in_err_bit(p);
            if (eb >= 0 && ip.last && ip.q.front().err) ip.user |= 1ull << eb;
            ip.presenting = true;
            nr_drive_in(t, p, true, ip.data, ip.keep, ip.last, ip.user);
        } else if (!ip.presenting) {
            nr_drive_in_valid(t, p, false);
        }
    }
    for (int p = 0; p < NR_NOUT; p++) {
        OutPort& op = s->out[p];
        op.ready = chance(s, op.rnum, op.rden);
        nr_out_set_ready(t, p, op.ready);
    }
#if NR_HAS_AXIL
    Axil& ax = s->ax;
    t->s_axil_awvalid = ax.st == AX_WRITE && !ax.aw_done;
    t->s_axil_wvalid = ax.st == AX_WRITE && !ax.w_done;
    t->s_axil_awaddr = ax.addr;
    t->s_axil_wdata = ax.data;
    t->s_axil_wstrb = ax.strb;
    t->s_axil_bready = ax.st == AX_WRITE || ax.st == AX_WRESP;
    t->s_axil_arvalid = ax.st == AX_READ;
    t->s_axil_araddr = ax.addr;
    t->s_axil_rready = ax.st == AX_READ || ax.st == AX_RRESP;
#endif
    t->clk = 0;
    t->eval();
    // ---- sample handshakes (what the rising edge will see)
    for (int p = 0; p < NR_NIN; p++) {
        InPort& ip = s->in[p];
        if (ip.presenting && nr_in_ready(t, p)) {
            s->beats_in++;
            s->last_activity = s->cycle;
            ip.presenting = false;
            ip.off += NR_BYTES;
            if (ip.last) {
                ip.q.pop_front();
                ip.off = 0;
                s->frames_in++;
            }
        }
    }
    for (int p = 0; p < NR_NOUT; p++) {
        OutPort& op = s->out[p];
        if (op.ready && nr_out_valid(t, p)) {
            uint32_t d[NR_WORDS];
            uint64_t keep, user;
            bool last;
            nr_out_beat(t, p, d, &keep, &last, &user);
            s->beats_out++;
            s->last_activity = s->cycle;
            // keep must be a run of low bytes; a short beat must be the last one
            int n = 0;
            while (n < NR_BYTES && ((keep >> n) & 1)) n++;
            uint64_t full = NR_BYTES >= 64 ? ~0ull : ((1ull << NR_BYTES) - 1);
            uint64_t runmask = n >= 64 ? ~0ull : ((1ull << n) - 1);
            if ((keep & full) != runmask || (n < NR_BYTES && !last)) s->protocol_errors++;
            const uint8_t* b = reinterpret_cast<const uint8_t*>(d);
            op.cur.insert(op.cur.end(), b, b + n);
            op.in_frame = !last;
            if (last) {
                int eb = nr_out_err_bit(p);
                bool err = eb >= 0 && ((user >> eb) & 1);
                s->outs.push_back(OutFrame{p, std::move(op.cur), err, s->cycle});
                op.cur.clear();
                s->frames_out++;
                s->new_output = true;
            }
        }
    }
#if NR_HAS_AXIL
    switch (ax.st) {
    case AX_WRITE:
        if (t->s_axil_awvalid && t->s_axil_awready) ax.aw_done = true;
        if (t->s_axil_wvalid && t->s_axil_wready) ax.w_done = true;
        if (ax.aw_done && ax.w_done) ax.st = AX_WRESP;
        break;
    case AX_WRESP:
        if (t->s_axil_bvalid) {
            ax.resp = t->s_axil_bresp;
            ax.st = AX_IDLE;
        }
        break;
    case AX_READ:
        if (t->s_axil_arready) ax.st = AX_RRESP;
        break;
    case AX_RRESP:
        if (t->s_axil_rvalid) {
            ax.rdata = t->s_axil_rdata;
            ax.resp = t->s_axil_rresp;
            ax.st = AX_IDLE;
        }
        break;
    default:
        break;
    }
#endif
    // ---- rising edge
    eval_rising(s);
    s->cycle++;
}

}  // namespace

extern "C" {

void* nr_new(uint64_t seed, int reset_cycles) {
    Sim* s = new Sim();
    s->ctx = new VerilatedContext;
    s->ctx->randReset(0);
    s->top = new Vtop{s->ctx};
    if (seed) s->rng ^= seed * 0xD1B54A32D192ED03ull;
    for (int p = 0; p < NR_NIN; p++) nr_drive_in_valid(s->top, p, false);
    s->top->rst = 1;
    for (int i = 0; i < reset_cycles; i++) {
        s->top->clk = 0;
        s->top->eval();
        s->top->clk = 1;
        s->top->eval();
    }
    s->top->rst = 0;
    // the simulation top registers rst (NR_RST_DELAY): clock it out, so that cycle 0 is the
    // first one the design runs out of reset, as with rst wired straight in
    for (int i = 0; i < NR_RST_DELAY; i++) {
        s->top->clk = 0;
        s->top->eval();
        s->top->clk = 1;
        s->top->eval();
    }
    s->top->clk = 0;
    s->top->eval();
    return s;
}

// Rising edges without the input-combinational region (see eval_rising) when `on` and the build
// allows it; returns whether they are used.
int nr_fast_edge(void* h, int on) {
    Sim* s = static_cast<Sim*>(h);
    s->fast_edge = NR_FAST_EDGE && on;
    return s->fast_edge;
}

void nr_free(void* h) {
    Sim* s = static_cast<Sim*>(h);
    if (s->worker) {
        {
            std::unique_lock<std::mutex> lk(s->worker->m);
            s->worker->cv.wait(lk, [s] { return !s->worker->busy.load(); });
            s->worker->quit = true;
            s->worker->cv.notify_all();
        }
        s->worker->th.join();
        delete s->worker;
    }
    s->top->final();
    delete s->top;
    delete s->ctx;
    delete s;
}

int nr_num_in(void) { return NR_NIN; }
int nr_num_out(void) { return NR_NOUT; }
int nr_bytes_per_beat(void) { return NR_BYTES; }

void nr_send(void* h, int port, const uint8_t* data, size_t n, int err) {
    Sim* s = static_cast<Sim*>(h);
    s->in[port].q.push_back(InFrame{std::vector<uint8_t>(data, data + n), err != 0});
}

// Run up to max_cycles; stop after a cycle that completed an output frame when stop_on_output,
// or (stop_when_idle) as soon as nothing is queued or moving and the last beat moved at least
// quiet cycles ago. Returns the cycles run.
// Queue a frame on a port as nr_send would at the start of cycle `cycle` (at once if the clock is
// already there). Frames of a port keep the order of the calls (a cycle before the previous
// frame's counts as that frame's cycle).
void nr_send_at(void* h, int port, const uint8_t* data, size_t n, int err, uint64_t cycle) {
    Sim* s = static_cast<Sim*>(h);
    InPort& ip = s->in[port];
    if (!ip.later.empty() && cycle < ip.later.back().first) cycle = ip.later.back().first;
    if (cycle <= s->cycle && ip.later.empty()) {
        ip.q.push_back(InFrame{std::vector<uint8_t>(data, data + n), err != 0});
        return;
    }
    ip.later.emplace_back(cycle, InFrame{std::vector<uint8_t>(data, data + n), err != 0});
}

uint64_t nr_run(void* h, uint64_t max_cycles, int stop_on_output, int stop_when_idle,
                uint64_t quiet) {
    Sim* s = static_cast<Sim*>(h);
    uint64_t start = s->cycle;
    s->new_output = false;
    while (s->cycle - start < max_cycles) {
        step(s);
        if (stop_on_output && s->new_output) break;
        if (stop_when_idle && s->cycle - s->last_activity > quiet) {
            bool idle = true;
            for (int p = 0; p < NR_NIN && idle; p++)
                idle = s->in[p].q.empty() && s->in[p].later.empty();
            for (int p = 0; p < NR_NOUT && idle; p++) idle = !s->out[p].in_frame;
            if (idle) break;
        }
    }
    return s->cycle - start;
}

static uint64_t now_ns(clockid_t c) {
    timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const uint64_t SPIN_NS = 40000;

// Spin until pred() or SPIN_NS have passed; returns pred().
static bool spin_for(bool (*pred)(Worker*), Worker* w) {
    uint64_t t0 = now_ns(CLOCK_MONOTONIC);
    for (unsigned i = 0;; i++) {
        if (pred(w)) return true;
        if ((i & 63) == 63 && now_ns(CLOCK_MONOTONIC) - t0 > SPIN_NS) return pred(w);
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
}

static void worker_loop(Sim* s) {
    Worker* w = s->worker;
    std::unique_lock<std::mutex> lk(w->m);
    for (;;) {
        lk.unlock();
        spin_for([](Worker* x) { return x->busy.load() || x->quit.load(); }, w);
        lk.lock();
        w->cv.wait(lk, [w] { return w->busy.load() || w->quit.load(); });
        if (w->quit) return;
        uint64_t n = w->todo;
        lk.unlock();
        uint64_t t0 = now_ns(CLOCK_MONOTONIC), c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        nr_run(s, n, 0, 0, 0);
        uint64_t t1 = now_ns(CLOCK_MONOTONIC), c1 = now_ns(CLOCK_THREAD_CPUTIME_ID);
        lk.lock();
        w->wall_ns += t1 - t0;
        w->cpu_ns += c1 - c0;
        w->busy = false;
        w->cv.notify_all();
    }
}

// Start running `cycles` cycles in the Sim's worker thread and return at once. Until nr_join
// returns, the caller must not touch the Sim with any other call.
void nr_run_async(void* h, uint64_t cycles) {
    Sim* s = static_cast<Sim*>(h);
    if (!s->worker) {
        s->worker = new Worker();
        s->worker->th = std::thread(worker_loop, s);
    }
    std::lock_guard<std::mutex> lk(s->worker->m);
    for (auto& f : s->outs) s->handed.push_back(std::move(f));
    s->outs.clear();
    s->worker->todo = cycles;
    s->worker->busy = true;
    s->worker->cv.notify_all();
}

// Wait for the run nr_run_async started (no-op if none); the seconds of wall and CPU time the
// worker has spent so far go to out2[0], out2[1].
void nr_join(void* h, double* out2) {
    Sim* s = static_cast<Sim*>(h);
    Worker* w = s->worker;
    if (!w) {
        out2[0] = out2[1] = 0.0;
        return;
    }
    spin_for([](Worker* x) { return !x->busy.load(); }, w);
    std::unique_lock<std::mutex> lk(w->m);
    w->cv.wait(lk, [w] { return !w->busy.load(); });
    out2[0] = w->wall_ns * 1e-9;
    out2[1] = w->cpu_ns * 1e-9;
}

uint64_t nr_cycle(void* h) { return static_cast<Sim*>(h)->cycle; }

// cycle, last_activity, queued input frames, output frame in progress, output frames ready
void nr_status(void* h, uint64_t* out5) {
    Sim* s = static_cast<Sim*>(h);
    uint64_t pend = 0, busy = 0;
    for (int p = 0; p < NR_NIN; p++) pend += s->in[p].q.size() + s->in[p].later.size();
    for (int p = 0; p < NR_NOUT; p++) busy |= s->out[p].in_frame;
    out5[0] = s->cycle;
    out5[1] = s->last_activity;
    out5[2] = pend;
    out5[3] = busy;
    out5[4] = s->outs.size();
}
uint64_t nr_last_activity(void* h) { return static_cast<Sim*>(h)->last_activity; }

// queued input frames (port < 0: all ports), including the one being sent and later ones
size_t nr_in_pending(void* h, int port) {
    Sim* s = static_cast<Sim*>(h);
    size_t n = 0;
    for (int p = 0; p < NR_NIN; p++)
        if (port < 0 || port == p) n += s->in[p].q.size() + s->in[p].later.size();
    return n;
}

int nr_out_busy(void* h) {
    Sim* s = static_cast<Sim*>(h);
    for (int p = 0; p < NR_NOUT; p++)
        if (s->out[p].in_frame) return 1;
    return 0;
}

// Output frames ready (not while a run_async is in flight: then see nr_out_pop).
size_t nr_out_count(void* h) {
    Sim* s = static_cast<Sim*>(h);
    return s->handed.size() + s->outs.size();
}

// Length of the oldest output frame (0 if none): size the buffer for nr_out_pop.
size_t nr_out_peek_len(void* h) {
    Sim* s = static_cast<Sim*>(h);
    if (!s->handed.empty()) return s->handed.front().bytes.size();
    return s->outs.empty() ? 0 : s->outs.front().bytes.size();
}

// Pop the oldest output frame into buf (cap bytes); returns its length, or -1 if none. While a
// run_async is in flight (`running`), only the frames handed over when it started.
long nr_out_pop(void* h, int* port, uint8_t* buf, size_t cap, int* err, uint64_t* cycle,
                int running) {
    Sim* s = static_cast<Sim*>(h);
    bool old = !s->handed.empty();
    if (!old && (running || s->outs.empty())) return -1;
    std::deque<OutFrame>& q = old ? s->handed : s->outs;
    OutFrame& f = q.front();
    size_t n = f.bytes.size() < cap ? f.bytes.size() : cap;
    std::memcpy(buf, f.bytes.data(), n);
    *port = f.port;
    *err = f.err;
    *cycle = f.cycle;
    long len = (long)f.bytes.size();
    q.pop_front();
    return len;
}

void nr_set_ready(void* h, int port, uint32_t num, uint32_t den) {
    Sim* s = static_cast<Sim*>(h);
    s->out[port].rnum = num;
    s->out[port].rden = den ? den : 1;
}

void nr_set_valid(void* h, int port, uint32_t num, uint32_t den) {
    Sim* s = static_cast<Sim*>(h);
    s->in[port].vnum = num;
    s->in[port].vden = den ? den : 1;
}

void nr_stats(void* h, uint64_t* out5) {
    Sim* s = static_cast<Sim*>(h);
    out5[0] = s->beats_in;
    out5[1] = s->beats_out;
    out5[2] = s->frames_in;
    out5[3] = s->frames_out;
    out5[4] = s->protocol_errors;
}

int nr_has_axil(void) { return NR_HAS_AXIL; }

// AXI4-Lite write: returns BRESP (0..3), or -1 when the slave did not answer in timeout cycles.
int nr_axil_write(void* h, uint32_t addr, uint32_t data, uint32_t strb, uint64_t timeout) {
#if NR_HAS_AXIL
    Sim* s = static_cast<Sim*>(h);
    s->ax = Axil{};
    s->ax.st = AX_WRITE;
    s->ax.addr = addr;
    s->ax.data = data;
    s->ax.strb = strb;
    for (uint64_t i = 0; i < timeout && s->ax.st != AX_IDLE; i++) step(s);
    if (s->ax.st != AX_IDLE) {
        s->ax.st = AX_IDLE;
        return -1;
    }
    return s->ax.resp;
#else
    (void)h; (void)addr; (void)data; (void)strb; (void)timeout;
    return -2;
#endif
}

// AXI4-Lite read: returns RRESP (0..3) with the data in *data, or -1 on timeout.
int nr_axil_read(void* h, uint32_t addr, uint32_t* data, uint64_t timeout) {
#if NR_HAS_AXIL
    Sim* s = static_cast<Sim*>(h);
    s->ax = Axil{};
    s->ax.st = AX_READ;
    s->ax.addr = addr;
    for (uint64_t i = 0; i < timeout && s->ax.st != AX_IDLE; i++) step(s);
    if (s->ax.st != AX_IDLE) {
        s->ax.st = AX_IDLE;
        return -1;
    }
    *data = s->ax.rdata;
    return s->ax.resp;
#else
    (void)h; (void)addr; (void)data; (void)timeout;
    return -2;
#endif
}

}  // extern "C"
