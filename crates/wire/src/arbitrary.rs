//! Proptest strategies for every typed message and parameter: valid values only, so that
//! `decode(encode(m)) == m` must hold for each of them (used by this crate's property tests and
//! by other crates' tests; enabled with the `arbitrary` feature).

use crate::asap::{self, AsapMessage};
use crate::enrp::{self, EnrpMessage, Peers};
use crate::{
    CauseCode, ErrorCause, HandleResolutionOption, LifeUnit, OperationError, Parameter, PeChecksum,
    PolicyType, PoolElement, PoolElementId, PoolHandle, PoolPolicy, RegistrarId, RegistrationLife,
    ServerInformation, TransportAddress, TransportProtocol, TransportUse, UserTransport,
};
use proptest::collection::vec;
use proptest::prelude::*;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

/// Pool handles of 1 to 32 bytes (the default limit), any byte values.
pub fn pool_handle() -> impl Strategy<Value = PoolHandle> {
    vec(any::<u8>(), 1..=32).prop_map(PoolHandle::new)
}

/// Any PE identifier.
pub fn pe_id() -> impl Strategy<Value = PoolElementId> {
    any::<u32>().prop_map(PoolElementId)
}

/// Any registrar identifier.
pub fn registrar_id() -> impl Strategy<Value = RegistrarId> {
    any::<u32>().prop_map(RegistrarId)
}

/// IPv4 and IPv6 addresses.
pub fn address() -> impl Strategy<Value = IpAddr> {
    prop_oneof![
        any::<u32>().prop_map(|a| IpAddr::V4(Ipv4Addr::from(a))),
        any::<u128>().prop_map(|a| IpAddr::V6(Ipv6Addr::from(a))),
    ]
}

/// Transport parameters of every protocol; SCTP with 1 to 4 addresses, the others with one.
pub fn transport() -> impl Strategy<Value = TransportAddress> {
    let protocol = prop_oneof![
        Just(TransportProtocol::Sctp),
        Just(TransportProtocol::Tcp),
        Just(TransportProtocol::Udp),
        Just(TransportProtocol::UdpLite),
        any::<u32>().prop_map(|service_code| TransportProtocol::Dccp { service_code }),
    ];
    let use_ = prop_oneof![
        Just(TransportUse::DataOnly),
        Just(TransportUse::DataPlusControl)
    ];
    (protocol, any::<u16>(), use_, vec(address(), 1..=4)).prop_map(
        |(protocol, port, transport_use, mut addresses)| {
            if protocol != TransportProtocol::Sctp {
                addresses.truncate(1);
            }
            TransportAddress {
                protocol,
                port,
                transport_use,
                addresses,
            }
        },
    )
}

/// SCTP transport parameters (ASAP transports, server information).
pub fn sctp_transport() -> impl Strategy<Value = TransportAddress> {
    (any::<u16>(), vec(address(), 1..=4))
        .prop_map(|(port, a)| TransportAddress::sctp(port, TransportUse::DataOnly, a))
}

/// User transports, opaque ones included.
pub fn user_transport() -> impl Strategy<Value = UserTransport> {
    prop_oneof![
        8 => transport().prop_map(UserTransport::Address),
        1 => vec(any::<u8>(), 0..16).prop_map(UserTransport::Opaque),
    ]
}

/// Every known policy with arbitrary values, and unknown ones with arbitrary value bytes.
pub fn policy() -> impl Strategy<Value = PoolPolicy> {
    let known = PolicyType::KNOWN;
    let known = (
        proptest::sample::select(known.to_vec()),
        vec(any::<u32>(), 4),
    )
        .prop_map(|(t, values)| {
            (0..=4)
                .find_map(|n| PoolPolicy::from_fields(t, &values[..n]))
                .expect("every known type has 0 to 4 fields")
        });
    let other = (any::<u32>(), vec(any::<u8>(), 0..12))
        .prop_filter("unknown policy types only", |(t, _)| {
            PolicyType(*t).name().is_none() && *t != 0 && *t != 0x4000_0000
        })
        .prop_map(|(policy_type, data)| PoolPolicy::Other { policy_type, data });
    prop_oneof![9 => known, 1 => other]
}

/// Registration lives representable in the given unit.
pub fn registration_life(unit: LifeUnit) -> impl Strategy<Value = RegistrationLife> {
    prop_oneof![
        1 => Just(RegistrationLife::Infinite),
        9 => (0..=i32::MAX as u64).prop_map(move |v| RegistrationLife::Finite(match unit {
            LifeUnit::Milliseconds => Duration::from_millis(v),
            LifeUnit::Seconds => Duration::from_secs(v),
        })),
    ]
}

/// Pool elements, with and without ASAP transport.
pub fn pool_element(unit: LifeUnit) -> impl Strategy<Value = PoolElement> {
    (
        pe_id(),
        registrar_id(),
        registration_life(unit),
        user_transport(),
        policy(),
        proptest::option::of(sctp_transport()),
    )
        .prop_map(
            |(id, home_registrar, registration_life, user_transport, policy, asap_transport)| {
                PoolElement {
                    id,
                    home_registrar,
                    registration_life,
                    user_transport,
                    policy,
                    asap_transport,
                }
            },
        )
}

/// Operation errors with 1 to 3 causes of any code.
pub fn operation_error() -> impl Strategy<Value = OperationError> {
    vec(
        (any::<u16>(), vec(any::<u8>(), 0..24)).prop_map(|(c, info)| ErrorCause {
            code: CauseCode::from_u16(c),
            info,
        }),
        1..=3,
    )
    .prop_map(|causes| OperationError { causes })
}

fn cookie() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..64)
}

fn server_information() -> impl Strategy<Value = ServerInformation> {
    (registrar_id(), transport()).prop_map(|(server_id, transport)| ServerInformation {
        server_id,
        transport,
    })
}

/// Every ASAP message type with arbitrary, valid contents.
pub fn asap_message(unit: LifeUnit) -> impl Strategy<Value = AsapMessage> {
    use AsapMessage as M;
    let pe = move || pool_element(unit);
    prop_oneof![
        (pool_handle(), pe()).prop_map(|(pool_handle, pool_element)| M::Registration(
            asap::Registration {
                pool_handle,
                pool_element
            }
        )),
        (pool_handle(), pe_id()).prop_map(|(pool_handle, pe_id)| M::Deregistration(
            asap::Deregistration { pool_handle, pe_id }
        )),
        (
            any::<bool>(),
            pool_handle(),
            pe_id(),
            proptest::option::of(operation_error())
        )
            .prop_map(
                |(reject, pool_handle, pe_id, error)| M::RegistrationResponse(
                    asap::RegistrationResponse {
                        reject,
                        pool_handle,
                        pe_id,
                        error
                    }
                )
            ),
        (
            pool_handle(),
            pe_id(),
            proptest::option::of(operation_error())
        )
            .prop_map(|(pool_handle, pe_id, error)| M::DeregistrationResponse(
                asap::DeregistrationResponse {
                    pool_handle,
                    pe_id,
                    error
                }
            )),
        (
            any::<bool>(),
            pool_handle(),
            proptest::option::of(any::<u32>())
        )
            .prop_map(|(subscribe, pool_handle, items)| M::HandleResolution(
                asap::HandleResolution {
                    subscribe,
                    pool_handle,
                    option: items.map(|items| HandleResolutionOption { items }),
                }
            )),
        (
            any::<bool>(),
            pool_handle(),
            proptest::option::of(policy()),
            vec(pe(), 0..4),
            proptest::option::of(operation_error())
        )
            .prop_map(
                |(accepted, pool_handle, overall_policy, pool_elements, error)| {
                    M::HandleResolutionResponse(asap::HandleResolutionResponse {
                        accepted,
                        pool_handle,
                        overall_policy,
                        pool_elements,
                        error,
                    })
                }
            ),
        (
            any::<bool>(),
            registrar_id(),
            pool_handle(),
            proptest::option::of(pe_id())
        )
            .prop_map(
                |(home, server_id, pool_handle, pe_id)| M::EndpointKeepAlive(
                    asap::EndpointKeepAlive {
                        home,
                        server_id,
                        pool_handle,
                        pe_id
                    }
                )
            ),
        (pool_handle(), pe_id()).prop_map(|(pool_handle, pe_id)| M::EndpointKeepAliveAck(
            asap::EndpointKeepAliveAck { pool_handle, pe_id }
        )),
        (pool_handle(), pe_id()).prop_map(|(pool_handle, pe_id)| M::EndpointUnreachable(
            asap::EndpointUnreachable { pool_handle, pe_id }
        )),
        (registrar_id(), vec(transport(), 0..3)).prop_map(|(server_id, transports)| {
            M::ServerAnnounce(asap::ServerAnnounce {
                server_id,
                transports,
            })
        }),
        cookie().prop_map(|cookie| M::Cookie(asap::Cookie { cookie })),
        cookie().prop_map(|cookie| M::CookieEcho(asap::CookieEcho { cookie })),
        (pool_handle(), vec(pe(), 0..4)).prop_map(|(pool_handle, pool_elements)| {
            M::BusinessCard(asap::BusinessCard {
                pool_handle,
                pool_elements,
            })
        }),
        operation_error().prop_map(|error| M::Error(asap::AsapError { error })),
    ]
}

fn peers() -> impl Strategy<Value = Peers> {
    (registrar_id(), registrar_id()).prop_map(|(sender, receiver)| Peers { sender, receiver })
}

fn takeover() -> impl Strategy<Value = enrp::Takeover> {
    (peers(), registrar_id()).prop_map(|(peers, target)| enrp::Takeover { peers, target })
}

/// Every ENRP message type with arbitrary, valid contents.
pub fn enrp_message(unit: LifeUnit) -> impl Strategy<Value = EnrpMessage> {
    use EnrpMessage as M;
    let pe = move || pool_element(unit);
    prop_oneof![
        (
            peers(),
            any::<bool>(),
            any::<u16>(),
            proptest::option::of(server_information())
        )
            .prop_map(|(peers, reply_required, c, server_information)| {
                M::Presence(enrp::Presence {
                    peers,
                    reply_required,
                    checksum: PeChecksum(c),
                    server_information,
                })
            }),
        (peers(), any::<bool>()).prop_map(|(peers, own_children_only)| {
            M::HandleTableRequest(enrp::HandleTableRequest {
                peers,
                own_children_only,
            })
        }),
        (
            peers(),
            any::<bool>(),
            any::<bool>(),
            vec(
                (pool_handle(), vec(pe(), 0..3)).prop_map(|(pool_handle, pool_elements)| {
                    enrp::HandleTableEntry {
                        pool_handle,
                        pool_elements,
                    }
                }),
                0..3
            )
        )
            .prop_map(|(peers, reject, more_to_send, entries)| {
                M::HandleTableResponse(enrp::HandleTableResponse {
                    peers,
                    reject,
                    more_to_send,
                    entries,
                })
            }),
        (
            peers(),
            any::<bool>(),
            prop_oneof![
                Just(enrp::UpdateAction::AddPe),
                Just(enrp::UpdateAction::DelPe)
            ],
            pool_handle(),
            pe()
        )
            .prop_map(
                |(peers, takeover_suggested, action, pool_handle, pool_element)| {
                    M::HandleUpdate(enrp::HandleUpdate {
                        peers,
                        takeover_suggested,
                        action,
                        pool_handle,
                        pool_element,
                    })
                }
            ),
        peers().prop_map(|peers| M::ListRequest(enrp::ListRequest { peers })),
        (peers(), any::<bool>(), vec(server_information(), 0..4)).prop_map(
            |(peers, reject, servers)| M::ListResponse(enrp::ListResponse {
                peers,
                reject,
                servers
            })
        ),
        takeover().prop_map(M::InitTakeover),
        takeover().prop_map(M::InitTakeoverAck),
        takeover().prop_map(M::TakeoverServer),
        (peers(), operation_error())
            .prop_map(|(peers, error)| M::Error(enrp::EnrpError { peers, error })),
    ]
}

/// Every parameter type on its own.
pub fn parameter(unit: LifeUnit) -> impl Strategy<Value = Parameter> {
    prop_oneof![
        address().prop_map(Parameter::Address),
        transport().prop_map(Parameter::Transport),
        vec(any::<u8>(), 0..16).prop_map(Parameter::OpaqueTransport),
        policy().prop_map(Parameter::Policy),
        pool_handle().prop_map(Parameter::PoolHandle),
        pool_element(unit).prop_map(Parameter::PoolElement),
        server_information().prop_map(Parameter::ServerInformation),
        operation_error().prop_map(Parameter::OperationError),
        cookie().prop_map(Parameter::Cookie),
        pe_id().prop_map(Parameter::PeIdentifier),
        any::<u16>().prop_map(|c| Parameter::PeChecksum(PeChecksum(c))),
        any::<u32>()
            .prop_map(|items| Parameter::HandleResolution(HandleResolutionOption { items })),
    ]
}
