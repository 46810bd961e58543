//! Test helpers: our typed messages rendered as the fields Wireshark's ASAP/ENRP dissectors
//! produce (`tshark -T fields` formatting), so that tshark's decode can be compared with ours.

#![allow(dead_code)]

use rserpool_wire::{
    asap, enrp, AsapMessage, CauseCode, EnrpMessage, Message, OperationError, PoolElement,
    PoolPolicy, RegistrationLife, ServerInformation, TransportAddress, TransportProtocol,
    TransportUse, UserTransport,
};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Field name (without protocol prefix) → occurrences in dissection order.
#[derive(Default, Debug, Clone, PartialEq, Eq)]
pub struct Fields {
    prefix: &'static str,
    pub map: BTreeMap<String, Vec<String>>,
}

impl Fields {
    pub fn new(prefix: &'static str) -> Self {
        Fields {
            prefix,
            map: BTreeMap::new(),
        }
    }

    fn push(&mut self, name: &str, value: impl Into<String>) {
        self.map
            .entry(format!("{}.{name}", self.prefix))
            .or_default()
            .push(value.into());
    }

    fn ptype(&mut self, t: u16) {
        self.push("parameter_type", format!("0x{t:04x}"));
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn id(v: u32) -> String {
        format!("0x{v:08x}")
    }

    fn pool_handle(&mut self, h: &rserpool_wire::PoolHandle) {
        self.ptype(0x0009);
        self.push("pool_handle_pool_handle", Self::hex(h.as_bytes()));
    }

    fn pe_identifier(&mut self, id: rserpool_wire::PoolElementId) {
        self.ptype(0x000e);
        self.push("pe_identifier", Self::id(id.0));
    }

    fn address(&mut self, a: &IpAddr) {
        match a {
            IpAddr::V4(v4) => {
                self.ptype(0x0001);
                self.push("ipv4_address", v4.to_string());
            }
            IpAddr::V6(v6) => {
                self.ptype(0x0002);
                self.push("ipv6_address", v6.to_string());
            }
        }
    }

    fn transport(&mut self, t: &TransportAddress) {
        self.ptype(t.protocol.parameter_type().0);
        let use_ = match t.transport_use {
            TransportUse::DataOnly => "0",
            TransportUse::DataPlusControl => "1",
        };
        match t.protocol {
            TransportProtocol::Sctp => {
                self.push("sctp_transport_port", t.port.to_string());
                self.push("transport_use", use_);
            }
            TransportProtocol::Tcp => {
                self.push("tcp_transport_port", t.port.to_string());
                self.push("transport_use", use_);
            }
            TransportProtocol::Udp => self.push("udp_transport_port", t.port.to_string()),
            TransportProtocol::UdpLite | TransportProtocol::Dccp { .. } => {}
        }
        for a in &t.addresses {
            self.address(a);
        }
    }

    fn policy(&mut self, p: &PoolPolicy) {
        self.ptype(0x0008);
        self.push(
            "pool_member_selection_policy_type",
            Self::id(p.policy_type().0),
        );
        // Wireshark shows weight and distance for the policies it knows; priority for Priority.
        match p {
            PoolPolicy::WeightedRoundRobin { weight } | PoolPolicy::WeightedRandom { weight } => {
                self.push("pool_member_selection_policy_weight", weight.to_string())
            }
            PoolPolicy::WeightedRandomDpf {
                weight, distance, ..
            } => {
                self.push("pool_member_selection_policy_weight", weight.to_string());
                self.push(
                    "pool_member_selection_policy_distance",
                    distance.to_string(),
                );
            }
            PoolPolicy::LeastUsedDpf { distance, .. } => self.push(
                "pool_member_selection_policy_distance",
                distance.to_string(),
            ),
            PoolPolicy::Priority { priority } => self.push(
                "pool_member_selection_policy_priority",
                priority.to_string(),
            ),
            _ => {}
        }
    }

    fn pool_element(&mut self, pe: &PoolElement, life_ms: impl Fn(RegistrationLife) -> i64) {
        self.ptype(0x000a);
        self.push("pool_element_pe_identifier", Self::id(pe.id.0));
        self.push(
            "pool_element_home_enrp_server_identifier",
            Self::id(pe.home_registrar.0),
        );
        self.push(
            "pool_element_registration_life",
            life_ms(pe.registration_life).to_string(),
        );
        match &pe.user_transport {
            UserTransport::Address(t) => self.transport(t),
            UserTransport::Opaque(_) => self.ptype(0x0010),
        }
        self.policy(&pe.policy);
        if let Some(t) = &pe.asap_transport {
            self.transport(t);
        }
    }

    fn server_information(&mut self, s: &ServerInformation, id_field: &str) {
        self.ptype(0x000b);
        self.push(id_field, Self::id(s.server_id.0));
        self.transport(&s.transport);
    }

    fn operation_error(&mut self, e: &OperationError) {
        self.ptype(0x000c);
        for c in &e.causes {
            self.push("cause_code", format!("0x{:04x}", c.code.to_u16()));
            let quotes_parameter = matches!(
                c.code,
                CauseCode::UnrecognizedParameter
                    | CauseCode::InvalidValues
                    | CauseCode::InconsistentPoolingPolicy
                    | CauseCode::InconsistentTransportType
            );
            if quotes_parameter && c.info.len() >= 4 {
                let t = u16::from_be_bytes([c.info[0], c.info[1]]);
                self.ptype(t);
                // Wireshark dissects the quoted parameter; the tests quote value-less policies.
                if t == 0x0008 && c.info.len() >= 8 {
                    let p = u32::from_be_bytes([c.info[4], c.info[5], c.info[6], c.info[7]]);
                    self.push("pool_member_selection_policy_type", Self::id(p));
                }
            }
        }
    }

    fn cookie(&mut self, c: &[u8]) {
        self.ptype(0x000d);
        if !c.is_empty() {
            self.push("cookie", Self::hex(c));
        }
    }

    fn header(&mut self, t: u8, bytes: &[u8]) {
        self.push("message_type", t.to_string());
        self.push("message_flags", format!("0x{:02x}", bytes[1]));
        self.push(
            "message_length",
            u16::from_be_bytes([bytes[2], bytes[3]]).to_string(),
        );
    }

    /// Appends the fields of one ASAP message; `bytes` is its encoding (for the header fields).
    pub fn asap(
        &mut self,
        m: &AsapMessage,
        bytes: &[u8],
        life_ms: impl Fn(RegistrationLife) -> i64 + Copy,
    ) {
        use AsapMessage as M;
        self.header(m.message_type(), bytes);
        match m {
            M::Registration(r) => {
                self.pool_handle(&r.pool_handle);
                self.pool_element(&r.pool_element, life_ms);
            }
            M::Deregistration(asap::Deregistration { pool_handle, pe_id })
            | M::EndpointKeepAliveAck(asap::EndpointKeepAliveAck { pool_handle, pe_id })
            | M::EndpointUnreachable(asap::EndpointUnreachable { pool_handle, pe_id }) => {
                self.pool_handle(pool_handle);
                self.pe_identifier(*pe_id);
            }
            M::RegistrationResponse(asap::RegistrationResponse {
                pool_handle,
                pe_id,
                error,
                ..
            })
            | M::DeregistrationResponse(asap::DeregistrationResponse {
                pool_handle,
                pe_id,
                error,
            }) => {
                self.pool_handle(pool_handle);
                self.pe_identifier(*pe_id);
                if let Some(e) = error {
                    self.operation_error(e);
                }
            }
            M::HandleResolution(h) => {
                self.pool_handle(&h.pool_handle);
                if let Some(o) = h.option {
                    self.ptype(0x803f);
                    self.push("hropt_items", o.items.to_string());
                }
            }
            M::HandleResolutionResponse(h) => {
                self.pool_handle(&h.pool_handle);
                if let Some(p) = &h.overall_policy {
                    self.policy(p);
                }
                for pe in &h.pool_elements {
                    self.pool_element(pe, life_ms);
                }
                if let Some(e) = &h.error {
                    self.operation_error(e);
                }
            }
            M::EndpointKeepAlive(k) => {
                self.push("server_identifier", Self::id(k.server_id.0));
                self.pool_handle(&k.pool_handle);
                if let Some(id) = k.pe_id {
                    self.pe_identifier(id);
                }
            }
            M::ServerAnnounce(s) => {
                self.push("server_identifier", Self::id(s.server_id.0));
                for t in &s.transports {
                    self.transport(t);
                }
            }
            M::Cookie(asap::Cookie { cookie }) | M::CookieEcho(asap::CookieEcho { cookie }) => {
                self.cookie(cookie)
            }
            M::BusinessCard(b) => {
                self.pool_handle(&b.pool_handle);
                for pe in &b.pool_elements {
                    self.pool_element(pe, life_ms);
                }
            }
            M::Error(e) => self.operation_error(&e.error),
        }
    }

    /// Appends the fields of one ENRP message.
    pub fn enrp(
        &mut self,
        m: &EnrpMessage,
        bytes: &[u8],
        life_ms: impl Fn(RegistrationLife) -> i64 + Copy,
    ) {
        use EnrpMessage as M;
        self.header(m.message_type(), bytes);
        let peers = m.peers();
        self.push("sender_servers_id", Self::id(peers.sender.0));
        self.push("receiver_servers_id", Self::id(peers.receiver.0));
        match m {
            M::Presence(p) => {
                self.ptype(0x000f);
                self.push("pe_checksum", format!("0x{:04x}", p.checksum.0));
                if let Some(s) = &p.server_information {
                    self.server_information(s, "server_information_server_identifier");
                }
            }
            M::HandleTableRequest(_) | M::ListRequest(_) => {}
            M::HandleTableResponse(h) => {
                for e in &h.entries {
                    self.pool_handle(&e.pool_handle);
                    for pe in &e.pool_elements {
                        self.pool_element(pe, life_ms);
                    }
                }
            }
            M::HandleUpdate(u) => {
                self.push(
                    "update_action",
                    match u.action {
                        enrp::UpdateAction::AddPe => "0",
                        enrp::UpdateAction::DelPe => "1",
                    },
                );
                self.pool_handle(&u.pool_handle);
                self.pool_element(&u.pool_element, life_ms);
            }
            M::ListResponse(l) => {
                for s in &l.servers {
                    self.server_information(s, "server_information_server_identifier");
                }
            }
            M::InitTakeover(t) | M::InitTakeoverAck(t) | M::TakeoverServer(t) => {
                self.push("target_servers_id", Self::id(t.target.0));
            }
            M::Error(e) => self.operation_error(&e.error),
        }
    }

    /// The fields joined as tshark's `-E aggregator=,` does.
    pub fn joined(&self) -> BTreeMap<String, String> {
        self.map
            .iter()
            .map(|(k, v)| (k.clone(), v.join(",")))
            .collect()
    }
}

/// Registration life as Wireshark prints it (the raw signed wire value).
pub fn life_ms(life: RegistrationLife) -> i64 {
    match life {
        RegistrationLife::Infinite => -1,
        RegistrationLife::Finite(d) => d.as_millis() as i64,
    }
}
