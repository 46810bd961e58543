//! `rserpool dump REGISTRAR`: reads a registrar's handlespace over ENRP, as RSPLIB's `hsdump`
//! does, and prints it as a table or as JSON (docs/registrar.md, "Reading a registrar's
//! handlespace").
//!
//! The dump joins the registrar as an ENRP peer for as long as it reads: ENRP_PRESENCE (so that
//! the registrar knows it; a request from a stranger is refused with R=1), LIST_REQUEST, and
//! ENRP_HANDLE_TABLE_REQUEST with W=0 (the whole table, RFC 5353 §2.2.2), again after every
//! ENRP_HANDLE_TABLE_RESPONSE with M=1 (more to send, RFC 5353 §2.2.3; the registrar's cursor for
//! this peer continues the table). Then it closes the association gracefully. It behaves as a polite peer meanwhile:
//! PRESENCE with R=1 is answered, HANDLE_UPDATEs are applied to the table being read, a
//! LIST_REQUEST gets an empty list, a HANDLE_TABLE_REQUEST a refusal (it has no table to give),
//! an INIT_TAKEOVER an acknowledgement (so that a takeover need not wait for it).
//!
//! [`Session`] is the protocol (sans-IO: bytes in, bytes out); [`run`] drives it over the
//! transport crate.

use crate::units::DurationValue;
use anyhow::{bail, Context, Result};
use clap::Args;
use rserpool_transport::{
    DownReason, Endpoint, EndpointConfig, Event, TransportChoice, TransportKind, PPID_ENRP,
};
use rserpool_wire::enrp::{self, EnrpMessage, Peers, UpdateAction};
use rserpool_wire::{
    Codec, CodecConfig, DecodeError, DecodeErrorKind, LifeUnit, OperationError, PeChecksum,
    PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    ServerInformation, TransportAddress, TransportUse, UserTransport,
};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// The ENRP port registered with IANA, used when the address names none.
pub const ENRP_PORT: u16 = 9901;

/// Options of `rserpool dump`.
#[derive(Args, Debug)]
pub struct DumpArgs {
    /// The registrar's ENRP address, ADDR or ADDR:PORT (host names too; port 9901 when none is
    /// given). Same as `--registrar`.
    #[arg(value_name = "ADDR[:PORT]", required_unless_present = "registrar")]
    target: Option<String>,
    /// The registrar's ENRP address (instead of the positional one).
    #[arg(long, value_name = "ADDR[:PORT]", conflicts_with = "target")]
    registrar: Option<String>,
    /// Transport: auto (SCTP where the kernel has it, else the TCP mapping), sctp or tcp. Use
    /// what the registrar's ENRP endpoint serves (RSPLIB: SCTP).
    #[arg(long, default_value = "auto", value_parser = ["auto", "sctp", "tcp"])]
    transport: String,
    /// The server ID this dump uses as an ENRP peer, decimal or hex (`0x1234abcd`); never 0,
    /// and it must differ from every registrar's ID. [default: random]
    #[arg(long, value_name = "ID")]
    server_id: Option<String>,
    /// Longest the whole dump may take (connecting, reading every part of the table), e.g.
    /// "10s", "1m".
    #[arg(long, default_value = "10s", value_name = "DURATION")]
    timeout: DurationValue,
    /// Print JSON (schema in docs/registrar.md) instead of the table.
    #[arg(long)]
    json: bool,
    /// Most PEs taken from the registrar; past it the dump stops with an error (a registrar
    /// that never ends its table cannot fill this host's memory).
    #[arg(long, default_value_t = 1_000_000, value_name = "N")]
    max_pool_elements: usize,
    /// Registration Life unit of the registrar: ms (RSPLIB) or s (RFC text).
    #[arg(long, default_value = "ms", value_parser = ["ms", "s"])]
    life_unit: String,
    #[command(flatten)]
    tls: crate::tls::TlsArgs,
}

/// Why a dump failed in the protocol (the transport's failures are reported by [`run`]).
#[derive(Debug, Clone, PartialEq)]
pub enum DumpError {
    /// The registrar answered the HANDLE_TABLE_REQUEST with R=1.
    Rejected {
        /// Its ID.
        registrar: RegistrarId,
    },
    /// A message from the registrar could not be decoded.
    Malformed(DecodeError),
    /// The registrar sent an ENRP_ERROR.
    ErrorReceived {
        /// Its ID.
        registrar: RegistrarId,
        /// What it said.
        error: OperationError,
    },
    /// The table has more PEs than `--max-pool-elements`.
    TooManyPoolElements {
        /// The limit.
        limit: usize,
    },
}

impl fmt::Display for DumpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DumpError::Rejected { registrar } => write!(
                f,
                "registrar {registrar} rejected the ENRP_HANDLE_TABLE_REQUEST (R flag): it did not \
                 take this dump as a peer. An rspregistrar ignores a PRESENCE whose addresses are \
                 below its -minaddressscope (site-local by default: loopback needs \
                 -minaddressscope=loopback); a registrar with TLS rules may refuse this identity \
                 as an ENRP peer; or its peer table is full"
            ),
            DumpError::Malformed(e) => write!(f, "malformed ENRP message from the registrar: {e}"),
            DumpError::ErrorReceived { registrar, error } => {
                write!(f, "registrar {registrar} answered with ENRP_ERROR: {error}")
            }
            DumpError::TooManyPoolElements { limit } => write!(
                f,
                "the registrar sent more than {limit} PEs (--max-pool-elements); dump stopped"
            ),
        }
    }
}

impl std::error::Error for DumpError {}

/// What the dump learned.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dump {
    /// The registrar's ID (from its PRESENCE or its responses).
    pub registrar: Option<RegistrarId>,
    /// The checksum over its own PEs it announced in its PRESENCE.
    pub announced_checksum: Option<PeChecksum>,
    /// Its Server Information, from its PRESENCE.
    pub registrar_information: Option<ServerInformation>,
    /// The registrars it knows (LIST_RESPONSE); `None` when it did not answer.
    pub peers: Option<Vec<ServerInformation>>,
    /// The handlespace: pools and their PEs, in pool handle and PE ID order.
    pub pools: BTreeMap<PoolHandle, BTreeMap<PoolElementId, PoolElement>>,
    /// HANDLE_TABLE_RESPONSEs read.
    pub responses: usize,
    /// HANDLE_UPDATEs applied while reading.
    pub updates: usize,
}

impl Dump {
    /// Number of PEs.
    pub fn pool_element_count(&self) -> usize {
        self.pools.values().map(BTreeMap::len).sum()
    }

    /// PEs and checksum per home registrar, computed over the table (RFC 5353 §3.6.2, with
    /// RSPLIB's 32-bit accumulator, the default profile's).
    pub fn homes(&self) -> BTreeMap<RegistrarId, (usize, PeChecksum)> {
        let mut by_home: BTreeMap<RegistrarId, Vec<(&PoolHandle, PoolElementId)>> = BTreeMap::new();
        for (handle, pes) in &self.pools {
            for pe in pes.values() {
                by_home
                    .entry(pe.home_registrar)
                    .or_default()
                    .push((handle, pe.id));
            }
        }
        by_home
            .into_iter()
            .map(|(home, pes)| {
                let n = pes.len();
                let sum = rserpool_handlespace::compute_checksum(
                    pes,
                    rserpool_handlespace::ChecksumFlavor::Rsplib,
                );
                (home, (n, sum))
            })
            .collect()
    }
}

/// The dump's side of ENRP, without I/O: [`Session::start`] once the association is up, then
/// [`Session::message`] for every ENRP message; send what [`Session::poll_transmit`] gives.
pub struct Session {
    me: RegistrarId,
    codec: Codec,
    max_pool_elements: usize,
    /// Our ENRP transport, for our Server Information (RSPLIB refuses a PRESENCE without one).
    local: Option<TransportAddress>,
    dump: Dump,
    count: usize,
    done: bool,
    out: VecDeque<Vec<u8>>,
}

impl Session {
    /// A session as server `me` (never 0).
    pub fn new(me: RegistrarId, codec: CodecConfig, max_pool_elements: usize) -> Self {
        Session {
            me,
            codec: Codec::new(codec),
            max_pool_elements,
            local: None,
            dump: Dump::default(),
            count: 0,
            done: false,
            out: VecDeque::new(),
        }
    }

    /// The association is up: PRESENCE with our (empty) checksum and Server Information,
    /// LIST_REQUEST, HANDLE_TABLE_REQUEST (W=0), in that order, as `hsdump` sends them.
    pub fn start(&mut self, local: Option<TransportAddress>) {
        self.local = local;
        self.presence(true);
        self.send(EnrpMessage::ListRequest(enrp::ListRequest {
            peers: self.ids(),
        }));
        self.request();
    }

    fn ids(&self) -> Peers {
        Peers {
            sender: self.me,
            receiver: self.dump.registrar.unwrap_or_default(),
        }
    }

    fn presence(&mut self, reply_required: bool) {
        self.send(EnrpMessage::Presence(enrp::Presence {
            peers: self.ids(),
            reply_required,
            // The checksum of an empty set of PEs (RFC 5353 §3.6.2): we own none.
            checksum: rserpool_handlespace::compute_checksum(
                [],
                rserpool_handlespace::ChecksumFlavor::Rsplib,
            ),
            server_information: self.local.clone().map(|transport| ServerInformation {
                server_id: self.me,
                transport,
            }),
        }));
    }

    fn request(&mut self) {
        self.send(EnrpMessage::HandleTableRequest(enrp::HandleTableRequest {
            peers: self.ids(),
            own_children_only: false,
        }));
    }

    fn send(&mut self, m: EnrpMessage) {
        // Our own messages always encode; a failure would be a bug, and is not worth a panic.
        if let Ok(b) = self.codec.encode(&m) {
            self.out.push_back(b);
        }
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// What was read so far.
    pub fn dump(&self) -> &Dump {
        &self.dump
    }

    /// The dump, at the end.
    pub fn into_dump(self) -> Dump {
        self.dump
    }

    /// An ENRP message from the registrar. `Ok(true)` once the table is complete.
    pub fn message(&mut self, bytes: &[u8]) -> Result<bool, DumpError> {
        let m = match self.codec.decode::<EnrpMessage>(bytes) {
            Ok(d) => d.message,
            // A message type newer than this codec: nothing the dump needs (RFC 5353 §3.7).
            Err(e) if matches!(e.kind, DecodeErrorKind::UnrecognizedMessage { .. }) => {
                return Ok(self.done)
            }
            Err(e) => return Err(DumpError::Malformed(e)),
        };
        let sender = m.peers().sender;
        if sender == self.me {
            return Ok(self.done);
        }
        if sender.0 != 0 && self.dump.registrar.is_none() {
            self.dump.registrar = Some(sender);
        }
        match m {
            EnrpMessage::Presence(p) => {
                if Some(sender) == self.dump.registrar {
                    self.dump.announced_checksum = Some(p.checksum);
                    if p.server_information.is_some() {
                        self.dump.registrar_information = p.server_information;
                    }
                }
                if p.reply_required {
                    self.presence(false);
                }
            }
            EnrpMessage::HandleTableResponse(r) => {
                if r.reject {
                    return Err(DumpError::Rejected { registrar: sender });
                }
                self.dump.responses += 1;
                for entry in r.entries {
                    for mut pe in entry.pool_elements {
                        if pe.home_registrar.0 == 0 {
                            pe.home_registrar = sender;
                        }
                        self.insert(&entry.pool_handle, pe)?;
                    }
                }
                if r.more_to_send {
                    self.request();
                } else {
                    self.done = true;
                }
            }
            EnrpMessage::HandleUpdate(u) => {
                self.dump.updates += 1;
                match u.action {
                    UpdateAction::AddPe => self.insert(&u.pool_handle, u.pool_element)?,
                    UpdateAction::DelPe => {
                        if let Some(pool) = self.dump.pools.get_mut(&u.pool_handle) {
                            if pool.remove(&u.pool_element.id).is_some() {
                                self.count -= 1;
                            }
                            if pool.is_empty() {
                                self.dump.pools.remove(&u.pool_handle);
                            }
                        }
                    }
                }
            }
            EnrpMessage::ListResponse(l) if !l.reject => {
                let (registrar, others): (Vec<_>, Vec<_>) = l
                    .servers
                    .into_iter()
                    .filter(|s| s.server_id != self.me)
                    .partition(|s| s.server_id == sender);
                if self.dump.registrar_information.is_none() {
                    self.dump.registrar_information = registrar.into_iter().next();
                }
                self.dump.peers = Some(others);
            }
            EnrpMessage::ListRequest(_) => {
                self.send(EnrpMessage::ListResponse(enrp::ListResponse {
                    peers: self.ids(),
                    reject: false,
                    servers: Vec::new(),
                }));
            }
            EnrpMessage::HandleTableRequest(_) => {
                // We hold no table of our own to give (a registrar starting up may take us
                // for its mentor): refused, so that it asks someone else.
                self.send(EnrpMessage::HandleTableResponse(
                    enrp::HandleTableResponse {
                        peers: self.ids(),
                        reject: true,
                        more_to_send: false,
                        entries: Vec::new(),
                    },
                ));
            }
            EnrpMessage::InitTakeover(t) if t.target != self.me => {
                // RFC 5353 §3.5.1: every peer acknowledges; the takeover need not wait for us.
                self.send(EnrpMessage::InitTakeoverAck(enrp::Takeover {
                    peers: Peers {
                        sender: self.me,
                        receiver: sender,
                    },
                    target: t.target,
                }));
            }
            EnrpMessage::Error(e) => {
                return Err(DumpError::ErrorReceived {
                    registrar: sender,
                    error: e.error,
                })
            }
            _ => {}
        }
        Ok(self.done)
    }

    fn insert(&mut self, handle: &PoolHandle, pe: PoolElement) -> Result<(), DumpError> {
        let pool = self.dump.pools.entry(handle.clone()).or_default();
        if !pool.contains_key(&pe.id) {
            if self.count >= self.max_pool_elements {
                return Err(DumpError::TooManyPoolElements {
                    limit: self.max_pool_elements,
                });
            }
            self.count += 1;
        }
        pool.insert(pe.id, pe);
        Ok(())
    }
}

/// The registrar's addresses: `ADDR:PORT`, `ADDR` (port 9901), `[IPv6]` or `[IPv6]:PORT`, `HOST[:PORT]`.
pub fn registrar_addresses(text: &str) -> Result<Vec<SocketAddr>> {
    let t = text.trim();
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(vec![a]);
    }
    let bare = t.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, ENRP_PORT)]);
    }
    let (host, port) = match t.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (
            h,
            p.parse::<u16>()
                .map_err(|_| anyhow::anyhow!("registrar {text:?}: {p:?} is not a port number"))?,
        ),
        _ => (t, ENRP_PORT),
    };
    if host.is_empty() {
        bail!("registrar {text:?}: no address");
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .with_context(|| format!("registrar {text:?}: cannot resolve {host:?}"))?
        .collect();
    if addrs.is_empty() {
        bail!("registrar {text:?}: {host:?} has no address");
    }
    Ok(addrs)
}

/// A server ID as given: decimal, `0x` hex or RSPLIB's `$` hex; never 0.
fn server_id(text: &str) -> Result<RegistrarId> {
    let t = text.trim();
    let v = if let Some(h) = t
        .strip_prefix("0x")
        .or_else(|| t.strip_prefix("0X"))
        .or_else(|| t.strip_prefix('$'))
    {
        u32::from_str_radix(h, 16)
    } else {
        t.parse::<u32>()
    }
    .map_err(|e| anyhow::anyhow!("--server-id {text:?}: {e} (decimal, or hex as 0x1234abcd)"))?;
    if v == 0 {
        bail!("--server-id: 0 means \"unknown\" in ENRP; give another ID");
    }
    Ok(RegistrarId(v))
}

/// Our Server Information transport: the association's local addresses at our port.
fn local_transport(kind: TransportKind, local: &[SocketAddr]) -> Option<TransportAddress> {
    let first = local.first()?;
    let ips: Vec<IpAddr> = local
        .iter()
        .map(|a| a.ip())
        .filter(|ip| !ip.is_unspecified())
        .collect();
    if ips.is_empty() {
        return None;
    }
    Some(match kind {
        TransportKind::Sctp => TransportAddress::sctp(first.port(), TransportUse::DataOnly, ips),
        TransportKind::Tcp => TransportAddress::tcp(first.port(), ips[0]),
    })
}

/// How far the dump got, for error messages.
fn progress(s: &Session) -> String {
    let d = s.dump();
    if d.registrar.is_none() {
        "nothing was received".to_string()
    } else {
        format!(
            "{} PE(s) in {} handle table response(s) received",
            s.count, d.responses
        )
    }
}

/// Runs `rserpool dump`.
pub fn run(args: DumpArgs) -> Result<()> {
    let text = args
        .target
        .clone()
        .or(args.registrar.clone())
        .context("the registrar's ENRP address is required")?;
    let addrs = registrar_addresses(&text)?;
    let transport = crate::pe::transport_choice("transport", Some(args.transport.as_str()))?;
    let me = match &args.server_id {
        Some(t) => server_id(t)?,
        None => RegistrarId(loop {
            let v: u32 = rand::random();
            if v != 0 {
                break v;
            }
        }),
    };
    if let Some(w) = args.timeout.deprecation("--timeout") {
        tracing::warn!("{w}");
    }
    let tls = args.tls.settings()?;
    if tls.is_some() && transport == TransportChoice::Sctp {
        bail!(
            "--transport sctp: {}",
            rserpool_transport::TlsError::OverSctp
        );
    }
    let codec = CodecConfig {
        registration_life_unit: if args.life_unit == "s" {
            LifeUnit::Seconds
        } else {
            LifeUnit::Milliseconds
        },
        ..CodecConfig::default()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (dump, kind) = rt.block_on(read_table(
        &addrs,
        transport,
        tls,
        me,
        codec,
        args.max_pool_elements,
        args.timeout.duration,
    ))?;
    if args.json {
        let doc = json(&dump, &addrs[0], kind, me);
        outln!(
            "{}",
            serde_json::to_string_pretty(&doc).context("encoding JSON")?
        );
    } else {
        print_table(&dump, &addrs[0], kind);
    }
    Ok(())
}

/// How long the registrar's PRESENCE is awaited after the last part of its table.
const PRESENCE_GRACE: Duration = Duration::from_secs(2);

/// Connects, reads the whole table, closes the association gracefully.
async fn read_table(
    addrs: &[SocketAddr],
    transport: TransportChoice,
    tls: Option<rserpool_transport::TlsSettings>,
    me: RegistrarId,
    codec: CodecConfig,
    max_pool_elements: usize,
    timeout: Duration,
) -> Result<(Dump, TransportKind)> {
    let tls_given = tls.is_some();
    let mut config = EndpointConfig::new(transport);
    config.tls = tls;
    config.limits.max_message_size = codec.max_message_size.max(64 * 1024);
    let mut endpoint = Endpoint::bind(config)
        .await
        .context("cannot open the local endpoint")?;
    let kind = endpoint.kind();
    let target = if addrs.len() == 1 {
        addrs[0].to_string()
    } else {
        format!("{addrs:?}")
    };
    let id = endpoint
        .connect(addrs)
        .await
        .with_context(|| format!("cannot reach the registrar at {target} over {kind}"))?;
    let mut session = Session::new(me, codec, max_pool_elements);
    let deadline = tokio::time::Instant::now() + timeout;
    // Once the table is complete, how long the registrar's PRESENCE (its ID and checksum) is
    // still awaited when it has not come yet (the answer to our R=1 may trail the table).
    let mut grace: Option<tokio::time::Instant> = None;
    let outcome: Result<()> = loop {
        let until = grace.map_or(deadline, |g| g.min(deadline));
        let event = match tokio::time::timeout_at(until, endpoint.next_event()).await {
            Ok(Some(e)) => e,
            Ok(None) => break Err(anyhow::anyhow!("the local endpoint closed")),
            Err(_) if grace.is_some() => {
                tracing::debug!("no PRESENCE from the registrar: its checksum stays unknown");
                break Ok(());
            }
            Err(_) => {
                break Err(anyhow::anyhow!(
                    "no complete handle table from the registrar at {target} over {kind} within \
                     {} ({}); is it a registrar's ENRP address (not ASAP's), over {kind}?",
                    crate::units::human(timeout),
                    progress(&session)
                ))
            }
        };
        match event {
            Event::AssociationUp {
                id: up,
                local_addrs,
                ..
            } if up == id => {
                session.start(local_transport(kind, &local_addrs));
            }
            Event::Message {
                id: from,
                ppid,
                data,
                ..
            } if from == id => {
                if ppid != PPID_ENRP {
                    tracing::debug!(ppid, "non-ENRP message from the registrar ignored");
                    continue;
                }
                match session.message(&data) {
                    Ok(true) if session.dump().announced_checksum.is_some() => break Ok(()),
                    Ok(true) => {
                        grace.get_or_insert(tokio::time::Instant::now() + PRESENCE_GRACE);
                    }
                    Ok(false) => {}
                    Err(e) => break Err(anyhow::Error::new(e)),
                }
            }
            Event::AssociationDown { id: down, .. } if down == id && grace.is_some() => {
                break Ok(())
            }
            Event::AssociationDown { id: down, reason } if down == id => {
                break Err(match reason {
                    DownReason::ConnectFailed(why) => {
                        anyhow::anyhow!("cannot reach the registrar at {target} over {kind}: {why}")
                    }
                    DownReason::Tls(why) => {
                        anyhow::anyhow!("TLS with the registrar at {target} failed: {why}")
                    }
                    other => anyhow::anyhow!(
                        "the registrar at {target} ended the association before the handle \
                         table was complete ({other}; {}){}",
                        progress(&session),
                        if tls_given {
                            "; a registrar with TLS refuses ENRP peers whose certificate its \
                             rules do not allow (--tls-enrp-peer)"
                        } else {
                            ""
                        }
                    ),
                })
            }
            _ => {}
        }
        while let Some(b) = session.poll_transmit() {
            if let Err(e) = endpoint.send(id, PPID_ENRP, 0, b).await {
                tracing::debug!(error = %e, "send to the registrar failed");
            }
        }
    };
    // Leave cleanly: answers queued last go out, then SHUTDOWN (SCTP) or FIN (TCP), so that the
    // registrar sees the association close rather than time out (docs/registrar.md).
    while let Some(b) = session.poll_transmit() {
        let _ = endpoint.send(id, PPID_ENRP, 0, b).await;
    }
    if endpoint.close(id).await.is_ok() {
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let Some(e) = endpoint.next_event().await {
                if matches!(e, Event::AssociationDown { id: down, .. } if down == id) {
                    break;
                }
            }
        })
        .await;
    }
    endpoint.shutdown();
    outcome?;
    Ok((session.into_dump(), kind))
}

fn life_text(l: &RegistrationLife) -> String {
    match l {
        RegistrationLife::Infinite => "infinite".into(),
        RegistrationLife::Finite(d) => crate::units::human(*d),
    }
}

/// Prints the table: the registrar, its peers, every pool with its PEs, counts.
fn print_table(d: &Dump, addr: &SocketAddr, kind: TransportKind) {
    let homes = d.homes();
    let registrar = d
        .registrar
        .map(|r| r.to_string())
        .unwrap_or_else(|| "(ID unknown)".into());
    let checksum = match (d.registrar, d.announced_checksum) {
        (Some(r), Some(c)) => {
            let (n, computed) = homes.get(&r).copied().unwrap_or((
                0,
                rserpool_handlespace::compute_checksum(
                    [],
                    rserpool_handlespace::ChecksumFlavor::Rsplib,
                ),
            ));
            format!(
                "PE checksum {:#06x} announced, {:#06x} over its {n} own PE(s) dumped{}",
                c.0,
                computed.0,
                if c == computed {
                    ""
                } else {
                    " (differs: the table changed while read, or another checksum flavour)"
                }
            )
        }
        _ => "PE checksum unknown (no PRESENCE received)".into(),
    };
    outln!("Registrar {registrar} at {addr} over {kind}: {checksum}");
    match &d.peers {
        Some(peers) => {
            outln!("Peers it knows: {}", peers.len());
            for p in peers {
                outln!("  {} at {}", p.server_id, p.transport);
            }
        }
        None => outln!("Peers it knows: unknown (no ENRP_LIST_RESPONSE)"),
    }
    outln!();
    let header = [
        "PE",
        "HOME",
        "POLICY",
        "LIFE",
        "USER TRANSPORT",
        "ASAP TRANSPORT",
    ];
    for (handle, pes) in &d.pools {
        outln!("Pool \"{handle}\": {} PE(s)", pes.len());
        let rows: Vec<[String; 6]> = pes
            .values()
            .map(|pe| {
                [
                    pe.id.to_string(),
                    pe.home_registrar.to_string(),
                    pe.policy.to_string(),
                    life_text(&pe.registration_life),
                    pe.user_transport.to_string(),
                    pe.asap_transport
                        .as_ref()
                        .map(|t| t.to_string())
                        .unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        let mut widths = header.map(str::len);
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r.iter()) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            cells
                .iter()
                .zip(widths.iter())
                .map(|(c, w)| format!("{c:<w$}"))
                .collect::<Vec<_>>()
                .join("  ")
                .trim_end()
                .to_string()
        };
        outln!("  {}", line(&header.map(String::from)));
        for r in &rows {
            outln!("  {}", line(r));
        }
        outln!();
    }
    outln!("PEs by home registrar:");
    for (home, (n, sum)) in &homes {
        outln!("  {home}: {n} PE(s), checksum {:#06x}", sum.0);
    }
    outln!(
        "Total: {} pool(s), {} PE(s) ({} handle table response(s), {} update(s) applied while reading)",
        d.pools.len(),
        d.pool_element_count(),
        d.responses,
        d.updates
    );
}

/// The JSON document (schema 1, docs/registrar.md). IDs and checksums are numbers.
#[derive(Serialize)]
struct JsonDump {
    schema: u32,
    registrar: JsonRegistrar,
    dump_server_id: u32,
    peers: Option<Vec<JsonServer>>,
    pools: Vec<JsonPool>,
    homes: Vec<JsonHome>,
    totals: JsonTotals,
}

#[derive(Serialize)]
struct JsonRegistrar {
    address: String,
    transport: &'static str,
    id: Option<u32>,
    pe_checksum: Option<u16>,
    enrp_transport: Option<JsonTransport>,
}

#[derive(Serialize)]
struct JsonServer {
    id: u32,
    transport: JsonTransport,
}

#[derive(Serialize)]
struct JsonPool {
    handle: String,
    handle_hex: String,
    pool_elements: Vec<JsonPe>,
}

#[derive(Serialize)]
struct JsonPe {
    id: u32,
    home_registrar: u32,
    registration_life_ms: Option<u64>,
    policy: JsonPolicy,
    user_transport: JsonTransport,
    asap_transport: Option<JsonTransport>,
}

#[derive(Serialize)]
struct JsonPolicy {
    #[serde(rename = "type")]
    policy_type: u32,
    name: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    weight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    load: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    degradation: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    distance: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dpf: Option<u32>,
}

#[derive(Serialize)]
struct JsonTransport {
    protocol: String,
    port: u16,
    addresses: Vec<String>,
    transport_use: &'static str,
}

#[derive(Serialize)]
struct JsonHome {
    id: u32,
    pool_elements: usize,
    pe_checksum: u16,
}

#[derive(Serialize)]
struct JsonTotals {
    pools: usize,
    pool_elements: usize,
    responses: usize,
    updates: usize,
}

fn json_transport(t: &TransportAddress) -> JsonTransport {
    JsonTransport {
        protocol: t.protocol.name().to_ascii_lowercase(),
        port: t.port,
        addresses: t.addresses.iter().map(|a| a.to_string()).collect(),
        transport_use: match t.transport_use {
            TransportUse::DataOnly => "data",
            TransportUse::DataPlusControl => "data+control",
        },
    }
}

fn json_user_transport(t: &UserTransport) -> JsonTransport {
    match t {
        UserTransport::Address(a) => json_transport(a),
        UserTransport::Opaque(b) => JsonTransport {
            protocol: "opaque".into(),
            port: 0,
            addresses: vec![b.iter().map(|x| format!("{x:02x}")).collect()],
            transport_use: "data",
        },
    }
}

fn json_policy(p: &PoolPolicy) -> JsonPolicy {
    let t = p.policy_type();
    let (distance, dpf) = p.distance_penalty().unzip();
    JsonPolicy {
        policy_type: t.0,
        name: t.name(),
        weight: p.weight(),
        priority: p.priority(),
        load: p.load(),
        degradation: p.degradation(),
        distance,
        dpf,
    }
}

fn json(d: &Dump, addr: &SocketAddr, kind: TransportKind, me: RegistrarId) -> JsonDump {
    JsonDump {
        schema: 1,
        registrar: JsonRegistrar {
            address: addr.to_string(),
            transport: match kind {
                TransportKind::Sctp => "sctp",
                TransportKind::Tcp => "tcp",
            },
            id: d.registrar.map(|r| r.0),
            pe_checksum: d.announced_checksum.map(|c| c.0),
            enrp_transport: d
                .registrar_information
                .as_ref()
                .map(|i| json_transport(&i.transport)),
        },
        dump_server_id: me.0,
        peers: d.peers.as_ref().map(|peers| {
            peers
                .iter()
                .map(|p| JsonServer {
                    id: p.server_id.0,
                    transport: json_transport(&p.transport),
                })
                .collect()
        }),
        pools: d
            .pools
            .iter()
            .map(|(handle, pes)| JsonPool {
                handle: handle.to_string(),
                handle_hex: handle
                    .as_bytes()
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect(),
                pool_elements: pes
                    .values()
                    .map(|pe| JsonPe {
                        id: pe.id.0,
                        home_registrar: pe.home_registrar.0,
                        registration_life_ms: match pe.registration_life {
                            RegistrationLife::Infinite => None,
                            RegistrationLife::Finite(l) => Some(l.as_millis() as u64),
                        },
                        policy: json_policy(&pe.policy),
                        user_transport: json_user_transport(&pe.user_transport),
                        asap_transport: pe.asap_transport.as_ref().map(json_transport),
                    })
                    .collect(),
            })
            .collect(),
        homes: d
            .homes()
            .into_iter()
            .map(|(id, (n, sum))| JsonHome {
                id: id.0,
                pool_elements: n,
                pe_checksum: sum.0,
            })
            .collect(),
        totals: JsonTotals {
            pools: d.pools.len(),
            pool_elements: d.pool_element_count(),
            responses: d.responses,
            updates: d.updates,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rserpool_registrar::enrp::{Enrp, EnrpConfig, EnrpDestination, Source};
    use rserpool_registrar::{
        AssociationId, AssociationKind, PeerInfo, Profile, Registrar, RegistrarConfig,
    };
    use rserpool_wire::asap::{self, AsapMessage};
    use rserpool_wire::Protocol;

    const ENRP_ASSOC: AssociationId = AssociationId(9);

    /// Our registrar's cores (ASAP and ENRP) with `n` PEs in two pools, in virtual time.
    struct Fixture {
        reg: Registrar,
        enrp: Enrp,
        now: Duration,
    }

    impl Fixture {
        fn new(n: u32) -> Fixture {
            let mut rc = RegistrarConfig::new(Profile::Rsplib);
            rc.registrar_id = RegistrarId(0x1001);
            rc.announce = None;
            rc.max_associations = 100_000;
            let mut reg = Registrar::new(rc, Duration::ZERO);
            let mut enrp = Enrp::new(EnrpConfig::new(Profile::Rsplib), &mut reg, Duration::ZERO);
            enrp.set_local_transport(
                &reg,
                TransportAddress::tcp(9901, "127.0.0.1".parse().unwrap()),
            );
            let codec = Codec::default();
            let now = Duration::from_secs(1);
            for i in 0..n {
                let a = rserpool_registrar::AssociationId(1000 + u64::from(i));
                let ip: IpAddr = format!("10.1.{}.{}", i >> 8, i & 0xff).parse().unwrap();
                reg.association_up(
                    now,
                    a,
                    PeerInfo {
                        kind: AssociationKind::Sctp,
                        addresses: vec![ip],
                        port: 40_000,
                    },
                );
                let m = AsapMessage::Registration(asap::Registration {
                    pool_handle: PoolHandle::from(if i % 3 == 0 { "Calc" } else { "Echo" }),
                    pool_element: PoolElement {
                        id: PoolElementId(i + 1),
                        home_registrar: RegistrarId(0),
                        registration_life: RegistrationLife::Finite(Duration::from_secs(300)),
                        user_transport: UserTransport::Address(TransportAddress::sctp(
                            7,
                            TransportUse::DataOnly,
                            vec![ip],
                        )),
                        policy: PoolPolicy::LeastUsed { load: i },
                        asap_transport: None,
                    },
                });
                reg.message(now, a, Protocol::Asap.ppid(), &codec.encode(&m).unwrap());
                while reg.poll_transmit().is_some() {}
                enrp.after_asap(&mut reg);
            }
            while enrp.poll_transmit().is_some() {}
            Fixture { reg, enrp, now }
        }

        /// Passes messages both ways until the session is done or nothing moves; the
        /// session's result.
        fn exchange(&mut self, s: &mut Session) -> Result<bool, DumpError> {
            for _ in 0..10_000 {
                let mut moved = false;
                while let Some(b) = s.poll_transmit() {
                    moved = true;
                    self.enrp
                        .message(self.now, &mut self.reg, Source::Association(ENRP_ASSOC), &b);
                }
                while let Some(t) = self.enrp.poll_transmit() {
                    if t.destination == EnrpDestination::Association(ENRP_ASSOC) {
                        moved = true;
                        if s.message(&t.bytes)? {
                            return Ok(true);
                        }
                    }
                }
                if !moved {
                    return Ok(s.done);
                }
            }
            Ok(s.done)
        }
    }

    #[test]
    fn reads_a_chunked_table_from_our_registrar_core_and_leaves_no_peer_behind() {
        let mut f = Fixture::new(300);
        let mut s = Session::new(RegistrarId(0xd00d), CodecConfig::default(), 1000);
        s.start(Some(TransportAddress::tcp(
            40_001,
            "127.0.0.1".parse().unwrap(),
        )));
        assert_eq!(f.exchange(&mut s), Ok(true));
        assert_eq!(f.enrp.peer_ids(), vec![RegistrarId(0xd00d)]);
        // Every PRESENCE of ours, the answer to the registrar's R=1 too, carries our Server
        // Information (RSPLIB answers one without it with ENRP_ERROR).
        let presence = from_registrar(EnrpMessage::Presence(enrp::Presence {
            peers: peers(),
            reply_required: true,
            checksum: PeChecksum(0xffff),
            server_information: None,
        }));
        assert_eq!(s.message(&presence), Ok(true));
        let reply = Codec::default()
            .decode::<EnrpMessage>(&s.poll_transmit().unwrap())
            .unwrap()
            .message;
        let EnrpMessage::Presence(reply) = reply else {
            panic!("{reply}")
        };
        assert!(!reply.reply_required);
        assert_eq!(
            reply.server_information.map(|i| i.transport.port),
            Some(40_001)
        );
        let d = s.into_dump();
        assert_eq!(d.registrar, Some(RegistrarId(0x1001)));
        assert_eq!(d.pool_element_count(), 300);
        assert_eq!(d.pools[&PoolHandle::from("Calc")].len(), 100);
        assert!(
            d.responses >= 3,
            "300 PEs in chunks of 128: {}",
            d.responses
        );
        assert_eq!(d.peers, Some(Vec::new()), "it knows no other registrar");
        let pe = &d.pools[&PoolHandle::from("Echo")][&PoolElementId(2)];
        assert_eq!(pe.home_registrar, RegistrarId(0x1001));
        assert_eq!(pe.policy, PoolPolicy::LeastUsed { load: 1 });
        assert!(
            pe.asap_transport.is_some(),
            "ENRP carries the ASAP transport"
        );
        let homes = d.homes();
        assert_eq!(homes.len(), 1);
        assert_eq!(
            Some(homes[&RegistrarId(0x1001)].1),
            d.announced_checksum,
            "the checksum over the dumped PEs is the one the registrar announced"
        );
        // The association closes: the registrar forgets the visitor at once.
        let now = f.now;
        f.enrp.association_down(now, &mut f.reg, ENRP_ASSOC);
        assert!(f.enrp.peer_ids().is_empty());
        let doc = serde_json::to_value(json(
            &d,
            &"127.0.0.1:9901".parse().unwrap(),
            TransportKind::Tcp,
            RegistrarId(0xd00d),
        ))
        .unwrap();
        assert_eq!(doc["registrar"]["id"], 0x1001);
        assert_eq!(doc["totals"]["pool_elements"], 300);
        assert_eq!(doc["pools"][0]["handle"], "Calc");
        assert_eq!(doc["pools"][1]["pool_elements"][0]["id"], 2);
        assert_eq!(
            doc["pools"][1]["pool_elements"][0]["policy"]["name"],
            "Least Used"
        );
        assert_eq!(doc["pools"][1]["pool_elements"][0]["policy"]["load"], 1);
        assert_eq!(
            doc["pools"][1]["pool_elements"][0]["registration_life_ms"],
            300_000
        );
    }

    #[test]
    fn a_request_without_presence_is_rejected_with_a_clear_cause() {
        let mut f = Fixture::new(3);
        let mut s = Session::new(RegistrarId(0xd00d), CodecConfig::default(), 1000);
        s.request(); // no PRESENCE first: a stranger
        let e = f.exchange(&mut s).unwrap_err();
        assert_eq!(
            e,
            DumpError::Rejected {
                registrar: RegistrarId(0x1001)
            }
        );
        assert!(e.to_string().contains("R flag"), "{e}");
        assert!(e.to_string().contains("-minaddressscope"), "{e}");
    }

    #[test]
    fn the_pool_element_limit_stops_the_dump() {
        let mut f = Fixture::new(200);
        let mut s = Session::new(RegistrarId(0xd00d), CodecConfig::default(), 150);
        s.start(None);
        assert_eq!(
            f.exchange(&mut s),
            Err(DumpError::TooManyPoolElements { limit: 150 })
        );
    }

    fn from_registrar(m: EnrpMessage) -> Vec<u8> {
        Codec::default().encode(&m).unwrap()
    }

    fn peers() -> Peers {
        Peers {
            sender: RegistrarId(7),
            receiver: RegistrarId(0xd00d),
        }
    }

    #[test]
    fn malformed_answers_errors_and_updates() {
        let mut s = Session::new(RegistrarId(0xd00d), CodecConfig::default(), 10);
        // Truncated: a header announcing more than there is.
        let e = s.message(&[0x02, 0x03, 0x00, 0x40, 0, 0]).unwrap_err();
        assert!(matches!(e, DumpError::Malformed(_)), "{e:?}");
        assert!(e.to_string().starts_with("malformed ENRP message"), "{e}");
        // A HANDLE_UPDATE adds a PE while the table is read; DEL_PE removes it again.
        let pe = PoolElement {
            id: PoolElementId(5),
            home_registrar: RegistrarId(7),
            registration_life: RegistrationLife::Infinite,
            user_transport: UserTransport::Address(TransportAddress::tcp(
                1,
                "10.0.0.1".parse().unwrap(),
            )),
            policy: PoolPolicy::RoundRobin,
            asap_transport: None,
        };
        let update = |action| {
            from_registrar(EnrpMessage::HandleUpdate(enrp::HandleUpdate {
                peers: peers(),
                takeover_suggested: false,
                action,
                pool_handle: PoolHandle::from("P"),
                pool_element: pe.clone(),
            }))
        };
        assert_eq!(s.message(&update(UpdateAction::AddPe)), Ok(false));
        assert_eq!(s.dump().pool_element_count(), 1);
        assert_eq!(s.message(&update(UpdateAction::DelPe)), Ok(false));
        assert_eq!(s.dump().pool_element_count(), 0);
        assert!(s.dump().pools.is_empty());
        // An INIT_TAKEOVER of another registrar is acknowledged.
        let it = from_registrar(EnrpMessage::InitTakeover(enrp::Takeover {
            peers: peers(),
            target: RegistrarId(9),
        }));
        assert_eq!(s.message(&it), Ok(false));
        let ack = Codec::default()
            .decode::<EnrpMessage>(&s.poll_transmit().unwrap())
            .unwrap()
            .message;
        assert!(matches!(ack, EnrpMessage::InitTakeoverAck(t) if t.target == RegistrarId(9)));
        // An ENRP_ERROR ends the dump with the registrar's cause.
        let err = from_registrar(EnrpMessage::Error(enrp::EnrpError {
            peers: peers(),
            error: OperationError::new(rserpool_wire::CauseCode::UnrecognizedMessage),
        }));
        let e = s.message(&err).unwrap_err();
        assert!(
            e.to_string().contains("ENRP_ERROR") && e.to_string().contains("$00000007"),
            "{e}"
        );
    }

    #[test]
    fn addresses_and_ids_as_operators_write_them() {
        let a = |t: &str| registrar_addresses(t).unwrap();
        assert_eq!(a("127.0.0.1:4000"), vec!["127.0.0.1:4000".parse().unwrap()]);
        assert_eq!(a("127.0.0.1"), vec!["127.0.0.1:9901".parse().unwrap()]);
        assert_eq!(a("[::1]"), vec!["[::1]:9901".parse().unwrap()]);
        assert_eq!(a("::1"), vec!["[::1]:9901".parse().unwrap()]);
        assert_eq!(a("[::1]:7"), vec!["[::1]:7".parse().unwrap()]);
        assert!(a("localhost").iter().all(|s| s.port() == 9901));
        assert!(registrar_addresses("127.0.0.1:port").is_err());
        assert!(registrar_addresses("").is_err());
        assert_eq!(server_id("0x1234abcd").unwrap(), RegistrarId(0x1234abcd));
        assert_eq!(server_id("$10").unwrap(), RegistrarId(16));
        assert_eq!(server_id("42").unwrap(), RegistrarId(42));
        assert!(server_id("0").unwrap_err().to_string().contains("unknown"));
        assert!(server_id("x").is_err());
    }
}
