//! What a run produced: its failure (if an invariant broke), counts, the trace hash that proves
//! a replay identical, and the readable trace when asked for.

use std::fmt;
use std::time::Duration;

/// An invariant that broke: which, where, and how to replay it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The run's seed.
    pub seed: u64,
    /// The step after which the check failed.
    pub step: u64,
    /// Virtual time of that step.
    pub time: Duration,
    /// The invariant's name (docs/simulation.md lists them).
    pub invariant: &'static str,
    /// What was seen.
    pub message: String,
}

impl Failure {
    /// The command that replays this run with a readable trace.
    pub fn replay_command(&self) -> String {
        format!(
            "SIM_SEED={} cargo test -p rserpool-sim --test seeds replay -- --nocapture   (or: scripts/sim --seed {} --trace)",
            self.seed, self.seed
        )
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {}: invariant `{}` broken at step {} (t = {:.6} s): {}\n  replay: {}",
            self.seed,
            self.invariant,
            self.step,
            self.time.as_secs_f64(),
            self.message,
            self.replay_command()
        )
    }
}

/// Counts of one run (or, summed, of many).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Events processed.
    pub steps: u64,
    /// Virtual time reached.
    pub simulated: Duration,
    /// Invariant checks made.
    pub checks: u64,
    /// Messages delivered over associations.
    pub messages: u64,
    /// Association retransmissions (lost packets on associations).
    pub retransmissions: u64,
    /// Datagrams delivered (announces, ENRP multicast PRESENCE), duplicates included.
    pub datagrams: u64,
    /// Datagrams lost.
    pub datagrams_lost: u64,
    /// Associations opened (or attempted).
    pub associations: u64,
    /// Associations lost because their ends could not reach each other.
    pub associations_timed_out: u64,
    /// Host crashes injected.
    pub crashes: u64,
    /// Restarts after a crash.
    pub restarts: u64,
    /// Partitions injected.
    pub partitions: u64,
    /// Pauses (SIGSTOP-like) injected.
    pub pauses: u64,
    /// PEs that left their pool (and rejoined later).
    pub departures: u64,
    /// Takeovers won by registrars.
    pub takeovers: u64,
    /// Handle resolutions answered.
    pub resolutions: u64,
    /// Handle resolutions failed (with a cause).
    pub resolutions_failed: u64,
    /// ENDPOINT_UNREACHABLE reports sent by pool users.
    pub unreachable_reports: u64,
    /// PEs removed because of such reports (after a failed probe).
    pub reported_away: u64,
    /// PingPong sessions opened by pool users.
    pub sessions: u64,
    /// Sessions that got every Ping answered and closed.
    pub sessions_finished: u64,
    /// Sessions that gave up (with a cause).
    pub sessions_failed: u64,
    /// Session failovers completed.
    pub failovers: u64,
    /// Failovers that echoed a cookie to the new PE first.
    pub failovers_with_cookie: u64,
    /// Cookie echoes the PEs received.
    pub cookie_echoes: u64,
    /// Pings sent (first sendings).
    pub pings: u64,
    /// Pings answered.
    pub pongs: u64,
    /// CalcApp jobs queued by pool users.
    pub jobs: u64,
    /// CalcApp jobs completed (reported by their pool users).
    pub jobs_completed: u64,
    /// CalcApp jobs a PE resumed from a cookie echo.
    pub jobs_resumed: u64,
    /// CalcApp Requests and cookie echoes a PE rejected (it was full).
    pub jobs_rejected: u64,
    /// Gateway sessions opened (gateway runs).
    pub gw_sessions: u64,
    /// Gateway sessions refused at a limit or for want of a member.
    pub gw_refused: u64,
    /// Gateway sessions closed in order.
    pub gw_closed: u64,
    /// Gateway sessions ended as member lost.
    pub gw_member_lost: u64,
    /// Gateway sessions ended as connect failed.
    pub gw_connect_failed: u64,
    /// Gateway sessions ended by a reset.
    pub gw_reset: u64,
    /// ASAP_BUSINESS_CARDs pool users received on their sessions.
    pub business_cards: u64,
    /// PEs selected from a business card (on a failover).
    pub card_selections: u64,
    /// Cookie echoes a PE refused (another key, none, altered, replayed, expired).
    pub cookie_refusals: u64,
    /// Cookie echoes tampered with on their way (altered or replaced by another user's).
    pub cookies_tampered: u64,
    /// Failovers that sessions in manual mode reported as necessary and the application
    /// continued.
    pub manual_failovers: u64,
    /// Failovers the application of a bound session asked for itself.
    pub requested_failovers: u64,
    /// Crashes of the gateway itself (each a new incarnation).
    pub gw_crashes: u64,
    /// Pauses of the gateway itself.
    pub gw_pauses: u64,
    /// Sessions that died with a crashed gateway incarnation (their clients saw a reset or a
    /// timeout).
    pub gw_orphaned: u64,
    /// Client connections that never reached a running gateway (down, or a SYN lost until the
    /// client gave up).
    pub gw_client_failed: u64,
    /// Member-list updates a gateway learnt from handle resolutions (RSerPool members).
    pub gw_resolutions: u64,
    /// Crashes of the registrar that feeds a gateway its members.
    pub gw_registrar_crashes: u64,
    /// TCP-mapped associations opened (or attempted).
    pub tcp_associations: u64,
    /// Path cuts (one address of a multi-homed host) injected.
    pub path_cuts: u64,
    /// Messages on an SCTP association that went over its alternate path (primary cut).
    pub failovers_to_alternate: u64,
    /// Associations a restarted host restarted at a peer (SCTP_RESTART or a TCP reset).
    pub restarts_seen: u64,
    /// ABORTs and RSTs a restarted host's kernel sent for messages on old associations.
    pub restart_aborts: u64,
    /// Messages hostile hosts sent to registrars.
    pub hostile_messages: u64,
    /// Hostile hosts' associations the registrars refused (no allowed identity).
    pub hostile_refused: u64,
    /// Operation errors the registrars answered malformed messages with.
    pub malformed_answered: u64,
}

impl Stats {
    /// Adds another run's counts.
    pub fn add(&mut self, o: &Stats) {
        self.steps += o.steps;
        self.simulated += o.simulated;
        self.checks += o.checks;
        self.messages += o.messages;
        self.retransmissions += o.retransmissions;
        self.datagrams += o.datagrams;
        self.datagrams_lost += o.datagrams_lost;
        self.associations += o.associations;
        self.associations_timed_out += o.associations_timed_out;
        self.crashes += o.crashes;
        self.restarts += o.restarts;
        self.partitions += o.partitions;
        self.pauses += o.pauses;
        self.departures += o.departures;
        self.takeovers += o.takeovers;
        self.resolutions += o.resolutions;
        self.resolutions_failed += o.resolutions_failed;
        self.unreachable_reports += o.unreachable_reports;
        self.reported_away += o.reported_away;
        self.sessions += o.sessions;
        self.sessions_finished += o.sessions_finished;
        self.sessions_failed += o.sessions_failed;
        self.failovers += o.failovers;
        self.failovers_with_cookie += o.failovers_with_cookie;
        self.cookie_echoes += o.cookie_echoes;
        self.pings += o.pings;
        self.pongs += o.pongs;
        self.jobs += o.jobs;
        self.jobs_completed += o.jobs_completed;
        self.jobs_resumed += o.jobs_resumed;
        self.jobs_rejected += o.jobs_rejected;
        self.gw_sessions += o.gw_sessions;
        self.gw_refused += o.gw_refused;
        self.gw_closed += o.gw_closed;
        self.gw_member_lost += o.gw_member_lost;
        self.gw_connect_failed += o.gw_connect_failed;
        self.gw_reset += o.gw_reset;
        self.business_cards += o.business_cards;
        self.card_selections += o.card_selections;
        self.cookie_refusals += o.cookie_refusals;
        self.cookies_tampered += o.cookies_tampered;
        self.manual_failovers += o.manual_failovers;
        self.requested_failovers += o.requested_failovers;
        self.gw_crashes += o.gw_crashes;
        self.gw_pauses += o.gw_pauses;
        self.gw_orphaned += o.gw_orphaned;
        self.gw_client_failed += o.gw_client_failed;
        self.gw_resolutions += o.gw_resolutions;
        self.gw_registrar_crashes += o.gw_registrar_crashes;
        self.tcp_associations += o.tcp_associations;
        self.path_cuts += o.path_cuts;
        self.failovers_to_alternate += o.failovers_to_alternate;
        self.restarts_seen += o.restarts_seen;
        self.restart_aborts += o.restart_aborts;
        self.hostile_messages += o.hostile_messages;
        self.hostile_refused += o.hostile_refused;
        self.malformed_answered += o.malformed_answered;
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} steps, {:.0} simulated s, {} invariant checks; {} messages ({} retransmissions), \
             {} datagrams ({} lost), {} associations ({} timed out); faults: {} crashes, {} \
             restarts, {} partitions, {} pauses, {} departures; {} takeovers; {} resolutions answered, {} failed; {} unreachable reports, {} PEs \
             removed on reports; {} sessions ({} finished, {} gave up), {} failovers ({} with a cookie, {} cookie echoes), {} pings, {} answered; CalcApp: {} jobs ({} completed, {} resumed from a cookie, {} rejections); gateway: {} sessions ({} refused, {} closed, {} member lost, {} connect failed, {} reset; {} gateway crashes, {} gateway pauses, {} sessions lost with the gateway, {} client connects failed, {} member updates from resolutions, {} registrar crashes); network: {} TCP-mapped associations, {} path cuts, {} messages over an alternate path, {} associations restarted, {} ABORTs/RSTs from restarted hosts; hostile: {} messages, {} associations refused, {} malformed answered with a cause",
            self.steps,
            self.simulated.as_secs_f64(),
            self.checks,
            self.messages,
            self.retransmissions,
            self.datagrams,
            self.datagrams_lost,
            self.associations,
            self.associations_timed_out,
            self.crashes,
            self.restarts,
            self.partitions,
            self.pauses,
            self.departures,
            self.takeovers,
            self.resolutions,
            self.resolutions_failed,
            self.unreachable_reports,
            self.reported_away,
            self.sessions,
            self.sessions_finished,
            self.sessions_failed,
            self.failovers,
            self.failovers_with_cookie,
            self.cookie_echoes,
            self.pings,
            self.pongs,
            self.jobs,
            self.jobs_completed,
            self.jobs_resumed,
            self.jobs_rejected,
            self.gw_sessions,
            self.gw_refused,
            self.gw_closed,
            self.gw_member_lost,
            self.gw_connect_failed,
            self.gw_reset,
            self.gw_crashes,
            self.gw_pauses,
            self.gw_orphaned,
            self.gw_client_failed,
            self.gw_resolutions,
            self.gw_registrar_crashes,
            self.tcp_associations,
            self.path_cuts,
            self.failovers_to_alternate,
            self.restarts_seen,
            self.restart_aborts,
            self.hostile_messages,
            self.hostile_refused,
            self.malformed_answered
        )?;
        write!(
            f,
            "; session extras: {} business cards ({} selections from a card), {} cookie echoes refused ({} tampered), {} manual failovers, {} requested failovers",
            self.business_cards,
            self.card_selections,
            self.cookie_refusals,
            self.cookies_tampered,
            self.manual_failovers,
            self.requested_failovers
        )
    }
}

/// The result of one run.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// Hash over every delivered message, datagram, timer and fault with its time: two runs of
    /// one seed must produce the same hash.
    pub trace_hash: u64,
    /// The first invariant that broke, if any.
    pub failure: Option<Failure>,
    /// Counts.
    pub stats: Stats,
    /// The readable trace (empty unless [`crate::SimConfig::trace`] was on).
    pub trace: Vec<String>,
    /// The pcap file of the delivered traffic (only when [`crate::SimConfig::pcap_limit`] asked
    /// for one; its layout is described in docs/simulation.md; the gateway world has none).
    pub pcap: Option<Vec<u8>>,
    /// Packets the pcap file left out because it reached its limit.
    pub pcap_left_out: u64,
}
