//! Registration, consistency checks, limits, indexes, checksums and timers.

mod common;

use common::{pe, pe_on, secs, HOME};
use rand::SeedableRng;
use rserpool_handlespace::{
    AssociationId, ChecksumFlavor, Error, Handlespace, HandlespaceConfig, Registration, TimerKind,
};
use rserpool_wire::{
    CauseCode, ParameterType, PeChecksum, PolicyType, PoolElementId, PoolHandle, PoolPolicy,
    RegistrarId, TransportAddress, TransportUse, UserTransport,
};

fn echo() -> PoolHandle {
    PoolHandle::from("EchoPool")
}

#[test]
fn first_pe_fixes_policy_transport_type_and_use() {
    let mut hs = Handlespace::default();
    hs.register(&echo(), pe(1, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap();

    let err = hs
        .register(&echo(), pe(2, PoolPolicy::Random), None, secs(0))
        .unwrap_err();
    assert_eq!(
        err,
        Error::InconsistentPolicy {
            pool: PolicyType::ROUND_ROBIN,
            requested: PolicyType::RANDOM
        }
    );
    assert_eq!(err.cause_code(), CauseCode::InconsistentPoolingPolicy);

    let mut tcp = pe(3, PoolPolicy::RoundRobin);
    tcp.user_transport = UserTransport::Address(TransportAddress::tcp(80, [10, 0, 0, 3].into()));
    let err = hs.register(&echo(), tcp, None, secs(0)).unwrap_err();
    assert_eq!(
        err,
        Error::InconsistentTransportType {
            pool: ParameterType::SCTP_TRANSPORT,
            requested: ParameterType::TCP_TRANSPORT
        }
    );
    assert_eq!(err.cause_code(), CauseCode::InconsistentTransportType);

    let mut control = pe(4, PoolPolicy::RoundRobin);
    control.user_transport = UserTransport::Address(TransportAddress::sctp(
        7,
        TransportUse::DataPlusControl,
        vec![[10, 0, 0, 4].into()],
    ));
    let err = hs.register(&echo(), control, None, secs(0)).unwrap_err();
    assert_eq!(
        err.cause_code(),
        CauseCode::InconsistentDataControlConfiguration
    );

    // The same checks apply to a re-registration of the pool's own PE.
    let err = hs
        .register(&echo(), pe(1, PoolPolicy::Random), None, secs(1))
        .unwrap_err();
    assert_eq!(err.cause_code(), CauseCode::InconsistentPoolingPolicy);
    assert_eq!(hs.len(), 1);
    hs.verify().unwrap();

    // Once the pool is gone, the next first PE may choose anew.
    hs.deregister(&echo(), PoolElementId(1)).unwrap();
    assert_eq!(hs.pool_count(), 0);
    hs.register(&echo(), pe(2, PoolPolicy::Random), None, secs(2))
        .unwrap();
    assert_eq!(hs.pool(&echo()).unwrap().policy_type(), PolicyType::RANDOM);
    hs.verify().unwrap();
}

#[test]
fn invalid_input_is_refused_with_invalid_values() {
    let mut hs = Handlespace::default();
    let cases = [
        hs.register(
            &PoolHandle::new(vec![]),
            pe(1, PoolPolicy::RoundRobin),
            None,
            secs(0),
        ),
        hs.register(
            &PoolHandle::new(vec![b'x'; 33]),
            pe(1, PoolPolicy::RoundRobin),
            None,
            secs(0),
        ),
        hs.register(&echo(), pe(0, PoolPolicy::RoundRobin), None, secs(0)),
        hs.register(
            &echo(),
            pe(
                1,
                PoolPolicy::Other {
                    policy_type: 0xb000_9999,
                    data: vec![],
                },
            ),
            None,
            secs(0),
        ),
    ];
    for result in cases {
        assert_eq!(result.unwrap_err().cause_code(), CauseCode::InvalidValues);
    }
    assert!(hs.is_empty());
    hs.verify().unwrap();
}

#[test]
fn limits_refuse_with_lack_of_resources() {
    let config = HandlespaceConfig {
        max_pools: 2,
        max_pool_elements_per_pool: 3,
        max_pool_elements: 5,
        ..HandlespaceConfig::default()
    };
    let mut hs = Handlespace::new(config);
    let a = PoolHandle::from("a");
    let b = PoolHandle::from("b");
    let c = PoolHandle::from("c");
    for id in 1..=3 {
        hs.register(&a, pe(id, PoolPolicy::RoundRobin), None, secs(0))
            .unwrap();
    }
    let err = hs
        .register(&a, pe(4, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap_err();
    assert_eq!(err, Error::PoolFull { limit: 3 });
    assert_eq!(err.cause_code(), CauseCode::LackOfResources);
    // Re-registration at the limit is an update, not a new PE.
    assert!(!hs
        .register(&a, pe(3, PoolPolicy::RoundRobin), None, secs(1))
        .unwrap()
        .is_new());

    hs.register(&b, pe(1, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap();
    let err = hs
        .register(&c, pe(1, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap_err();
    assert_eq!(err, Error::TooManyPools { limit: 2 });
    assert_eq!(err.cause_code(), CauseCode::LackOfResources);

    hs.register(&b, pe(2, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap();
    let err = hs
        .register(&b, pe(3, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap_err();
    assert_eq!(err, Error::HandlespaceFull { limit: 5 });
    assert_eq!(err.cause_code(), CauseCode::LackOfResources);
    assert_eq!((hs.len(), hs.pool_count()), (5, 2));
    hs.verify().unwrap();
}

#[test]
fn reregistration_updates_the_entry_owner_and_association() {
    let mut hs = Handlespace::default();
    let r1 = hs
        .register(
            &echo(),
            pe(7, PoolPolicy::LeastUsed { load: 10 }),
            Some(AssociationId(1)),
            secs(1),
        )
        .unwrap();
    let Registration::New(entry) = r1 else {
        panic!("new entry expected")
    };
    let other = RegistrarId(0x1234);
    let r2 = hs
        .register(
            &echo(),
            pe_on(7, PoolPolicy::LeastUsed { load: 20 }, other),
            Some(AssociationId(2)),
            secs(5),
        )
        .unwrap();
    let Registration::Updated {
        entry: same,
        previous,
    } = r2
    else {
        panic!("update expected")
    };
    assert_eq!(same, entry);
    assert_eq!(previous.policy, PoolPolicy::LeastUsed { load: 10 });
    let e = hs.get(entry).unwrap();
    assert_eq!(e.element().policy, PoolPolicy::LeastUsed { load: 20 });
    assert_eq!((e.registered_at(), e.updated_at()), (secs(1), secs(5)));
    assert_eq!(e.association(), Some(AssociationId(2)));
    assert_eq!(hs.owned_count(HOME), 0);
    assert_eq!(
        hs.owned_by(other).map(|e| e.id()).collect::<Vec<_>>(),
        [PoolElementId(7)]
    );
    assert_eq!(hs.registered_over(AssociationId(1)).count(), 0);
    assert_eq!(hs.registered_over(AssociationId(2)).count(), 1);
    assert_eq!(hs.association_count(), 1);
    hs.verify().unwrap();
}

#[test]
fn lost_association_removes_exactly_its_pes() {
    let mut hs = Handlespace::default();
    let pools = [PoolHandle::from("p1"), PoolHandle::from("p2")];
    for id in 1..=10u32 {
        let a = AssociationId(u64::from(id % 3));
        hs.register(
            &pools[(id % 2) as usize],
            pe(id, PoolPolicy::RoundRobin),
            Some(a),
            secs(0),
        )
        .unwrap();
    }
    // PEs learned from a peer have no association.
    hs.register(
        &pools[0],
        pe_on(99, PoolPolicy::RoundRobin, RegistrarId(5)),
        None,
        secs(0),
    )
    .unwrap();
    let removed = hs.remove_association(AssociationId(1));
    let mut ids: Vec<u32> = removed.iter().map(|(_, r)| r.element.id.0).collect();
    ids.sort();
    assert_eq!(ids, [1, 4, 7, 10]);
    assert!(removed
        .iter()
        .all(|(_, r)| r.association == Some(AssociationId(1))));
    // 4 and 10 were registered in p1 (even ids), 1 and 7 in p2.
    let in_p1 = removed.iter().filter(|(h, _)| h == &pools[0]).count();
    assert_eq!(in_p1, 2);
    assert_eq!(hs.len(), 7);
    assert_eq!(hs.registered_over(AssociationId(1)).count(), 0);
    for (_, r) in &removed {
        assert!(hs.get(r.entry).is_none(), "stale id must not resolve");
    }
    hs.verify().unwrap();
    assert!(hs.remove_association(AssociationId(1)).is_empty());
}

#[test]
fn checksums_match_rsplib_capture_through_the_handlespace() {
    // rsplib-takeover.pcap: $4b6b12b3 registers DeadPool/$3138b21e and EchoPool/$a2a2df63 and
    // then announces 0xc74e; after DeadPool's PE leaves it announces 0x104b.
    let mut hs = Handlespace::default();
    let dead = PoolHandle::from("DeadPool");
    assert_eq!(hs.checksum(HOME), PeChecksum(0xffff));
    hs.register(
        &dead,
        pe(0x3138_b21e, PoolPolicy::RoundRobin),
        None,
        secs(0),
    )
    .unwrap();
    hs.register(
        &echo(),
        pe(0xa2a2_df63, PoolPolicy::RoundRobin),
        None,
        secs(0),
    )
    .unwrap();
    // Someone else's PEs do not count.
    hs.register(
        &echo(),
        pe_on(5, PoolPolicy::RoundRobin, RegistrarId(9)),
        None,
        secs(0),
    )
    .unwrap();
    assert_eq!(hs.checksum(HOME), PeChecksum(0xc74e));
    hs.deregister(&dead, PoolElementId(0x3138_b21e)).unwrap();
    assert_eq!(hs.checksum(HOME), PeChecksum(0x104b));
    let owners: Vec<_> = hs.owners().map(|o| (o.owner, o.elements)).collect();
    assert_eq!(owners, [(RegistrarId(9), 1), (HOME, 1)]);
    hs.verify().unwrap();
}

#[test]
fn rsplib_flavor_wraps_where_rfc_1071_does_not() {
    let config = |checksum_flavor| HandlespaceConfig {
        max_pool_handle_len: 4096,
        checksum_flavor,
        ..HandlespaceConfig::default()
    };
    let mut rsplib = Handlespace::new(config(ChecksumFlavor::Rsplib));
    let mut rfc = Handlespace::new(config(ChecksumFlavor::Rfc1071));
    let handle = PoolHandle::new(vec![0xff; 4096]);
    for id in 1..=40 {
        rsplib
            .register(&handle, pe(id, PoolPolicy::RoundRobin), None, secs(0))
            .unwrap();
        rfc.register(&handle, pe(id, PoolPolicy::RoundRobin), None, secs(0))
            .unwrap();
    }
    assert_ne!(rsplib.checksum(HOME), rfc.checksum(HOME));
    rsplib.verify().unwrap();
    rfc.verify().unwrap();
}

#[test]
fn takeover_moves_ownership_and_checksum() {
    let mut hs = Handlespace::default();
    let dead = RegistrarId(0xdead);
    let me = RegistrarId(0x1);
    for id in 1..=5 {
        hs.register(
            &echo(),
            pe_on(id, PoolPolicy::RoundRobin, dead),
            None,
            secs(0),
        )
        .unwrap();
    }
    hs.register(&echo(), pe_on(6, PoolPolicy::RoundRobin, me), None, secs(0))
        .unwrap();
    let h = echo();
    let before_all = rserpool_handlespace::compute_checksum(
        (1..=6).map(|id| (&h, PoolElementId(id))),
        ChecksumFlavor::Rsplib,
    );
    assert_eq!(hs.take_over(dead, me), 5);
    assert_eq!(hs.owned_count(dead), 0);
    assert_eq!(hs.checksum(dead), PeChecksum(0xffff));
    assert_eq!(hs.checksum(me), before_all);
    assert!(hs.owned_by(me).all(|e| e.home_registrar() == me));
    let entry = hs.entry_id(&echo(), PoolElementId(3)).unwrap();
    assert_eq!(hs.set_home_registrar(entry, dead).unwrap(), me);
    assert_eq!(hs.owned_count(dead), 1);
    hs.verify().unwrap();
    assert_eq!(hs.remove_owned_by(me).len(), 5);
    assert_eq!(hs.len(), 1);
    hs.verify().unwrap();
}

#[test]
fn timers_fire_in_deadline_order_and_can_be_replaced_or_cancelled() {
    let mut hs = Handlespace::default();
    let mut entries = Vec::new();
    for id in 1..=5u32 {
        let e = hs
            .register(&echo(), pe(id, PoolPolicy::RoundRobin), None, secs(0))
            .unwrap()
            .entry();
        hs.set_timer(e, TimerKind::Expiry, secs(100 - u64::from(id)))
            .unwrap();
        entries.push(e);
    }
    // Re-arm PE 1 earlier as a keep-alive transmission, cancel PE 2's.
    hs.set_timer(entries[0], TimerKind::KeepAliveTransmission, secs(10))
        .unwrap();
    assert_eq!(
        hs.cancel_timer(entries[1]).unwrap().unwrap().deadline,
        secs(98)
    );
    assert_eq!(hs.next_timer().unwrap().entry, entries[0]);
    assert_eq!(
        hs.get(entries[0]).unwrap().timer().unwrap().kind,
        TimerKind::KeepAliveTransmission
    );
    assert!(hs.pop_due(secs(9)).is_none());
    let due: Vec<_> = std::iter::from_fn(|| hs.pop_due(secs(97))).collect();
    let order: Vec<_> = due.iter().map(|t| (t.entry, t.deadline)).collect();
    assert_eq!(
        order,
        [
            (entries[0], secs(10)),
            (entries[4], secs(95)),
            (entries[3], secs(96)),
            (entries[2], secs(97))
        ]
    );
    assert_eq!(hs.timer_count(), 0);
    // A removed PE's timer goes with it, and its id goes stale.
    hs.set_timer(entries[2], TimerKind::KeepAliveTimeout, secs(200))
        .unwrap();
    let (handle, removed) = hs.remove(entries[2]).unwrap();
    assert_eq!((handle, removed.element.id), (echo(), PoolElementId(3)));
    assert!(hs.next_timer().is_none());
    assert_eq!(
        hs.set_timer(entries[2], TimerKind::Expiry, secs(1)),
        Err(Error::StaleEntry)
    );
    hs.verify().unwrap();
}

#[test]
fn unreachability_reports_count_until_reregistration() {
    let mut hs = Handlespace::default();
    let e = hs
        .register(&echo(), pe(1, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap()
        .entry();
    assert_eq!(hs.report_unreachable(e), Ok(1));
    assert_eq!(hs.report_unreachable(e), Ok(2));
    hs.register(&echo(), pe(1, PoolPolicy::RoundRobin), None, secs(1))
        .unwrap();
    assert_eq!(hs.get(e).unwrap().unreachability_reports(), 0);
}

#[test]
fn unknown_pool_and_pe_are_reported() {
    let mut hs = Handlespace::default();
    let mut rng = <rand::rngs::SmallRng as rand::SeedableRng>::seed_from_u64(0);
    let err = hs.select(&echo(), 3, &mut rng).unwrap_err();
    assert_eq!(err.cause_code(), CauseCode::UnknownPoolHandle);
    hs.register(&echo(), pe(1, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap();
    let err = hs.deregister(&echo(), PoolElementId(2)).unwrap_err();
    assert_eq!(err, Error::UnknownPoolElement(PoolElementId(2)));
}

#[test]
fn chunked_walks_resume_after_the_last_pool_and_pe() {
    let mut hs = Handlespace::default();
    for (h, id) in [("b", 5), ("a", 9), ("b", 2), ("c", 1), ("b", 7)] {
        hs.register(
            &PoolHandle::from(h),
            pe(id, PoolPolicy::RoundRobin),
            None,
            secs(0),
        )
        .unwrap();
    }
    let after_a: Vec<String> = hs
        .pools_after(&PoolHandle::from("a"))
        .map(|p| p.handle().to_string())
        .collect();
    assert_eq!(after_a, ["b", "c"]);
    let b = hs.pool(&PoolHandle::from("b")).unwrap();
    let ids: Vec<u32> = b
        .elements_after(PoolElementId(2))
        .map(|e| e.id().0)
        .collect();
    assert_eq!(ids, [5, 7]);
    assert_eq!(b.elements().count(), 3);
}

#[test]
fn revision_changes_with_the_registered_values_only() {
    let mut hs = Handlespace::default();
    let entry = hs
        .register(&echo(), pe(1, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap()
        .entry();
    hs.register(&echo(), pe(2, PoolPolicy::RoundRobin), None, secs(0))
        .unwrap();
    let revision = |hs: &Handlespace| hs.get(entry).unwrap().revision();
    let r0 = revision(&hs);

    // Selections, timers and unreachability reports leave the registered values alone.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    for _ in 0..4 {
        hs.select(&echo(), 2, &mut rng).unwrap();
    }
    hs.set_timer(entry, TimerKind::KeepAliveTransmission, secs(5))
        .unwrap();
    hs.report_unreachable(entry).unwrap();
    assert_eq!(revision(&hs), r0);

    // Each re-registration (even with the same values), a new home and a takeover change it.
    hs.register(&echo(), pe(1, PoolPolicy::RoundRobin), None, secs(1))
        .unwrap();
    let r1 = revision(&hs);
    assert_ne!(r1, r0);
    let other = RegistrarId(0x77);
    hs.set_home_registrar(entry, other).unwrap();
    let r2 = revision(&hs);
    assert_ne!(r2, r1);
    hs.set_home_registrar(entry, other).unwrap();
    assert_eq!(revision(&hs), r2, "the same home again changes nothing");
    hs.take_over(other, HOME);
    assert_ne!(revision(&hs), r2);
    assert_eq!(hs.get(entry).unwrap().home_registrar(), HOME);
}
